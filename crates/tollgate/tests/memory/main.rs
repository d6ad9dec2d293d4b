//! Tests that read the resident memory of their own process: a binary apart from the other
//! tests, so that nothing else they build or start shares it (and, under nextest, each test
//! runs in a process of its own).

mod churning;

mod memory_bound;
mod memory_churn;
mod memory_footprint;
