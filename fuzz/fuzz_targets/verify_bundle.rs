//! Fuzz target `verify_bundle`: see `check_verify_bundle` in the crate root for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    retryledger_fuzz::check_verify_bundle(data);
});
