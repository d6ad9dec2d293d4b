//! Fuzz target `native_config`: see `crates/tollgate-server/tests/harness`, which the regression
//! test `tests/fuzzed.rs` shares.
#![no_main]

#[path = "../../crates/tollgate-server/tests/harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::native_config(data));
