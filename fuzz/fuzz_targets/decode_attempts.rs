//! Fuzz target `decode_attempts`: see `check_decode_attempts` in the crate root for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    retryledger_fuzz::check_decode_attempts(data);
});
