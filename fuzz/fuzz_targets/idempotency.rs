//! Fuzz target `idempotency`: see `check_idempotency` in the crate root for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    retryledger_fuzz::check_idempotency(data);
});
