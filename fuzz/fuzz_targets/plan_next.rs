//! Fuzz target `plan_next`: see `check_plan_next` in the crate root for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    retryledger_fuzz::check_plan_next(data);
});
