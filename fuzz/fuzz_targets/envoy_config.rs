//! Fuzz target `envoy_config`: see `crates/tollgate-server/tests/integration/harness`, which the regression
//! test `tests/integration/fuzzed.rs` shares.
#![no_main]

#[path = "../../crates/tollgate-server/tests/integration/harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::envoy_config(data));
