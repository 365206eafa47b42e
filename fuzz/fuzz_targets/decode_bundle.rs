//! Fuzz target `decode_bundle`: see `check_decode_bundle` in the crate root for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    retryledger_fuzz::check_decode_bundle(data);
});
