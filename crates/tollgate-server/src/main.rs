//! `tollgate`: the rate limit service and its command line. This file only sets up logging,
//! parses the command line and hands it to [`tollgate_server::cli`].

use std::process::ExitCode;

use clap::Parser;
use tollgate_server::cli::{self, Cli};
use tollgate_server::envoy::settings;

/// mimalloc: the service allocates per request (bodies, answers, headers), and mimalloc's
/// thread-local free lists make that cheaper than glibc's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| settings::log_level().into());
    // LOG_FORMAT=json (the Envoy service's setting): one JSON object a line. A bad value is
    // refused when `serve` reads the settings; until then, text.
    if settings::log_json().unwrap_or(false) {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    let cli = Cli::parse();
    cli::run(cli)
}
