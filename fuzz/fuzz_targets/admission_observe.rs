//! Fuzz target `admission_observe`: see `check_admission_observe` in the crate root for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    retryledger_fuzz::check_admission_observe(data);
});
