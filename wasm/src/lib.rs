//! WebAssembly bindings of retryledger-core (built only for wasm32).
#![cfg(target_arch = "wasm32")]
