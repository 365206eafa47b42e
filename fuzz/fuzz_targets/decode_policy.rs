//! Fuzz target `decode_policy`: see `check_decode_policy` in the crate root for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    retryledger_fuzz::check_decode_policy(data);
});
