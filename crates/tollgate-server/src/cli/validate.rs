//! `tollgate validate FILE...`: checks rule files as `serve` would load them, without
//! connecting to anything.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::{provider, service};

/// Loads `files` as `serve` would and prints what they hold, or the first error with its
/// file, line and column; exit code 1 when invalid.
pub(super) fn run(files: &[PathBuf]) -> ExitCode {
    let checked = provider::load(files).and_then(|config| {
        service::check(&config)?;
        Ok(config)
    });
    match checked {
        Ok(config) => {
            let routes = config.engine.routes().len();
            let domains = config.engine.domains().count();
            let rules = routes + config.engine.domains().map(|d| d.limits()).sum::<usize>();
            println!("ok: {rules} rules ({routes} routes, {domains} Envoy domains)");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
