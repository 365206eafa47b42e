//! Fuzz target `judge`: see `check_judge` in the crate root for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    retryledger_fuzz::check_judge(data);
});
