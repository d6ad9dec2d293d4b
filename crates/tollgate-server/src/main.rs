//! `tollgate`: the rate limit service and its command line. This file only parses the command
//! line and hands it to [`tollgate_server::cli`].

use std::process::ExitCode;

use clap::Parser;
use tollgate_server::cli::{self, Cli};

/// mimalloc: the service allocates per request (bodies, answers, headers), and mimalloc's
/// thread-local free lists make that cheaper than glibc's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Logging (and traces) start in `cli::run`, on its runtime: spans are exported from it.
    let cli = Cli::parse();
    cli::run(cli)
}
