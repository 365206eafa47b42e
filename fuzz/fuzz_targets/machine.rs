//! Fuzz target `machine`: the run machine driven by arbitrary answers (any
//! answer to any effect, any store view, crashes resumed from any journal
//! prefix); see `retryledger_core::machine::arbitrary` for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(finding) = retryledger_core::machine::arbitrary::drive(data) {
        panic!("{finding}");
    }
});
