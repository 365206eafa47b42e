//! Fuzz target `repair_chain`: see `check_repair_chain` in the crate root for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    retryledger_fuzz::check_repair_chain(data);
});
