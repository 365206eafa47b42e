//! Fuzz target `price_cost`: see `check_price_cost` in the crate root for what it asserts.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    retryledger_fuzz::check_price_cost(data);
});
