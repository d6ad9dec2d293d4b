//! `tollgate`: the rate limit service and its command line. This file only parses the command
//! line and hands it to [`tollgate_server::cli`].

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use tollgate_server::cli::{self, Cli};

/// mimalloc: the service allocates per request (bodies, answers, headers), and mimalloc's
/// thread-local free lists make that cheaper than glibc's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Started as `ratelimit` (the image's /bin/ratelimit, the command Envoy Gateway gives
    // envoyproxy/ratelimit's container), it serves, as that service does.
    let mut args: Vec<OsString> = std::env::args_os().collect();
    if args.first().and_then(|a| Path::new(a).file_name()) == Some(OsStr::new("ratelimit")) {
        args.insert(1, "serve".into());
    }
    // Logging (and traces) start in `cli::run`, on its runtime: spans are exported from it.
    let cli = Cli::parse_from(args);
    cli::run(cli)
}
