//! Fuzz target `build_policy`: see `check_build_policy` in the crate root for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    retryledger_fuzz::check_build_policy(data);
});
