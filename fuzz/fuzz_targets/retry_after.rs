//! Fuzz target `retry_after`: see `check_retry_after` in the crate root for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    retryledger_fuzz::check_retry_after(data);
});
