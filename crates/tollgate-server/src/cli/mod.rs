//! The command line: one file per command. `serve` runs the service; `validate`, `check`,
//! `simulate`, `bench` and `schema` are its tools.

pub mod bench;
mod check;
pub mod schema;
pub mod serve;
pub mod simulate;
mod validate;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The command line of `tollgate`.
#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    version,
    about = "A distributed rate limiter: the service and its tools"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serves the rules of the files over HTTP and gRPC.
    Serve {
        /// Rule files, native or Envoy's format (merged), or directories of them. Without
        /// one, the directory where the Envoy ratelimit service reads its files:
        /// `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY`.
        #[arg(long = "config", short = 'c', num_args = 1..)]
        config: Vec<PathBuf>,
        /// The HTTP address, instead of the file's `server.http`.
        #[arg(long)]
        http: Option<SocketAddr>,
        /// The gRPC address, instead of the file's `server.grpc`.
        #[arg(long)]
        grpc: Option<SocketAddr>,
        /// The admin API's bearer token; without one the admin API refuses every call.
        #[arg(long, env = "TOLLGATE_ADMIN_TOKEN", hide_env_values = true)]
        admin_token: Option<String>,
        /// gRPC answers carry the rate limit fields for Envoy to add to its answer, as the
        /// file's `server.grpc_response_headers: true` does.
        #[arg(long)]
        grpc_response_headers: bool,
    },
    /// Checks rule files and prints the first error with its file, line and column.
    Validate {
        /// Rule files (or directories of them), checked together as `serve` would merge them.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Runs a traffic pattern through algorithms on a simulated clock: a table of what each
    /// admitted, and a chart of offered and admitted requests over time.
    Simulate {
        /// uniform, burst, edge (a spike at a window edge), ramp, or file:PATH (arrival times in
        /// seconds, one per line).
        #[arg(long, default_value = "edge")]
        pattern: String,
        /// Algorithms to compare, as rule files name them.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "fixed_window,sliding_window,sliding_log,token_bucket,leaky_bucket(shaper),gcra"
        )]
        algorithms: Vec<String>,
        /// The limit per period.
        #[arg(long, default_value_t = 100)]
        limit: u64,
        /// The period (`10s`, `1m`).
        #[arg(long, default_value = "1m")]
        period: String,
        /// Requests per second, for uniform and (at its end) ramp.
        #[arg(long, default_value_t = 5.0)]
        rate: f64,
        /// How long to simulate.
        #[arg(long, default_value = "3m")]
        duration: String,
        /// The window T of "most admitted in any window" (default: the period).
        #[arg(long)]
        window: Option<String>,
        /// The longest a shaper may delay a request.
        #[arg(long, default_value = "1m")]
        max_delay: String,
        /// Where to draw the chart (.png or .svg).
        #[arg(long)]
        chart: Option<PathBuf>,
    },
    /// Asks a running server: a request (`--method`, `--path`, `--header`) or a rule and key;
    /// a check, or metered work: `--report` (the cost of work done, taken whatever is left),
    /// `--reserve` (an estimate, with `--ttl`), `--commit ID` (the real cost of a
    /// reservation), `--cancel ID`. Prints the server's JSON answer alone on standard output
    /// (for `jq`) and the HTTP status on standard error. Exit code: 0 admitted, 1 denied (429,
    /// or in debt after a report or commit), 2 anything else (a refused check, an unknown
    /// reservation, no answer).
    Check {
        /// The server's HTTP address.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        server: String,
        #[command(flatten)]
        ask: Ask,
        /// Permits to take: a check's, a report's, a reservation's estimate, a commit's real
        /// cost.
        #[arg(long, default_value_t = 1)]
        cost: u64,
        #[command(flatten)]
        metered: Metered,
        /// With `--reserve`: how long the reservation lives unsettled (`30s`, `5m`).
        #[arg(long, requires = "reserve")]
        ttl: Option<String>,
    },
    /// Loads a running deployment with checks, over HTTP or Envoy's gRPC service, and reports
    /// how many were admitted, denied or failed, the rate and the latency. `{key}` in a path,
    /// header value, key or descriptor value becomes the check's number modulo `--keys`.
    Bench(BenchArgs),
    /// Prints the JSON Schema of rule files (native and Envoy's) for editors: with
    /// yaml-language-server, `# yaml-language-server: $schema=tollgate.schema.json` at the top
    /// of a rule file completes and checks it as you type.
    Schema,
}

/// What `check` and `bench` ask over HTTP: a request to match, or a rule and key.
#[derive(Debug, clap::Args)]
struct Ask {
    /// The request's method.
    #[arg(long, default_value = "GET")]
    method: String,
    /// The request's path.
    #[arg(long)]
    path: Option<String>,
    /// A header of the request, `name: value` (repeatable).
    #[arg(long = "header", short = 'H')]
    headers: Vec<String>,
    /// A rule to check `--key` under, instead of a request.
    #[arg(long, requires = "key", conflicts_with_all = ["path", "headers"])]
    rule: Option<String>,
    /// The key to check under `--rule`.
    #[arg(long)]
    key: Option<String>,
}

impl Ask {
    /// The JSON body of a check of `cost` permits.
    fn body(&self, cost: u64) -> anyhow::Result<serde_json::Value> {
        bench::check_body(
            &self.method,
            self.path.as_deref(),
            &self.headers,
            self.rule.as_deref(),
            self.key.as_deref(),
            cost,
        )
    }
}

/// What `check` asks instead of a check: metered work.
#[derive(Debug, clap::Args)]
#[group(multiple = false)]
struct Metered {
    /// Reports the cost of work done (`POST /v1/report`).
    #[arg(long)]
    report: bool,
    /// Reserves the cost as an estimate (`POST /v1/reservations`); prints its id.
    #[arg(long)]
    reserve: bool,
    /// Commits reservation ID at the cost (`POST /v1/reservations/ID/commit`).
    #[arg(long, value_name = "ID", conflicts_with_all = ["path", "headers", "rule"])]
    commit: Option<String>,
    /// Cancels reservation ID (`DELETE /v1/reservations/ID`).
    #[arg(long, value_name = "ID", conflicts_with_all = ["path", "headers", "rule"])]
    cancel: Option<String>,
}

/// The flags of `bench`.
#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// The server's HTTP address (`POST /v1/check`).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    server: String,
    /// Envoy's gRPC rate limit service at this address instead (with `--domain` and
    /// `--descriptor`).
    #[arg(long, requires = "domain")]
    grpc: Option<String>,
    /// The Envoy domain of the gRPC checks.
    #[arg(long)]
    domain: Option<String>,
    /// An entry of the gRPC checks' descriptor, `key=value` (repeatable).
    #[arg(long = "descriptor", short = 'd')]
    descriptor: Vec<String>,
    #[command(flatten)]
    ask: Ask,
    /// Permits each check takes.
    #[arg(long, default_value_t = 1)]
    cost: u32,
    /// How many values `{key}` takes.
    #[arg(long, default_value_t = 1)]
    keys: u64,
    /// Checks in flight at once, each on its own connection.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Stop after this many checks (default 10000 when no --duration is given).
    #[arg(long)]
    requests: Option<u64>,
    /// Stop after this long (`10s`, `1m`).
    #[arg(long)]
    duration: Option<String>,
    /// Checks per second in all, each due at its time (latency counts from then); without
    /// it, each connection sends as soon as its last check is answered.
    #[arg(long)]
    rate: Option<f64>,
}

/// The traces `serve` will export: its files' `server.tracing`, else the environment's
/// `TRACING_ENABLED` settings. Read before anything logs, so that logging starts with them;
/// files that do not load are `serve`'s to report.
fn traces_of(command: &Command) -> Option<crate::config::TracingSettings> {
    let Command::Serve { config, .. } = command else {
        return None;
    };
    let files = if config.is_empty() {
        vec![crate::provider::runtime_directory()]
    } else {
        config.clone()
    };
    crate::provider::load(&files)
        .or_else(|_| crate::provider::without_files())
        .ok()?
        .server
        .tracing
}

/// Runs the command `cli` asks for on a runtime of its own; the exit code to end with.
pub fn run(cli: Cli) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let traces = crate::telemetry::init(traces_of(&cli.command).as_ref());
        let result = match cli.command {
            Command::Serve {
                config,
                http,
                grpc,
                admin_token,
                grpc_response_headers,
            } => serve::run(serve::Options {
                files: config,
                http,
                grpc,
                admin_token,
                grpc_response_headers,
            })
            .await
            .map(|()| ExitCode::SUCCESS),
            Command::Validate { files } => Ok(validate::run(&files)),
            Command::Simulate {
                pattern,
                algorithms,
                limit,
                period,
                rate,
                duration,
                window,
                max_delay,
                chart,
            } => simulate::command(
                &pattern,
                &algorithms,
                limit,
                &period,
                rate,
                &duration,
                window.as_deref(),
                &max_delay,
                chart.as_deref(),
            ),
            Command::Check {
                server,
                ask,
                cost,
                metered,
                ttl,
            } => {
                let call = match metered {
                    Metered { report: true, .. } => check::Call::Report(ask.body(cost)?),
                    Metered { reserve: true, .. } => {
                        let mut body = ask.body(cost)?;
                        if let Some(ttl) = ttl {
                            body["ttl"] = ttl.into();
                        }
                        check::Call::Reserve(body)
                    }
                    Metered {
                        commit: Some(id), ..
                    } => check::Call::Commit(id, cost),
                    Metered {
                        cancel: Some(id), ..
                    } => check::Call::Cancel(id),
                    _ => check::Call::Check(ask.body(cost)?),
                };
                Ok(check::run(&server, call).await)
            }
            Command::Bench(args) => bench::command(args).await,
            Command::Schema => Ok(schema::run()),
        };
        if let Some(traces) = traces {
            traces.shutdown();
        }
        result
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
