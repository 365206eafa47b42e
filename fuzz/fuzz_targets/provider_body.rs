//! Fuzz target `provider_body`: see `check_provider_body` in the crate root for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    retryledger_fuzz::check_provider_body(data);
});
