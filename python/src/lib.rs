//! Python bindings of retryledger-core.
