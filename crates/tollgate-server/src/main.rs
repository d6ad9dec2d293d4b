//! `tollgate`: the rate limit service and its command line.
//!
//! - `tollgate serve --config FILE...`: HTTP (check, nginx auth_request, admin, metrics) and
//!   Envoy's gRPC rate limit service, reloading the files when they change or on SIGHUP;
//! - `tollgate validate FILE...`: checks rule files, errors with file, line and column;
//! - `tollgate check`: asks a running server about a request or a key;
//! - `tollgate bench`: loads a running deployment and reports its answers and latency.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// mimalloc: the service allocates per request (bodies, answers, headers), and mimalloc's
/// thread-local free lists make that cheaper than glibc's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use tollgate_server::{bench, config, serve};

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "A distributed rate limiter: the service and its tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
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
    /// Asks a running server: a request (`--method`, `--path`, `--header`) or a rule and key.
    /// Prints the server's JSON answer alone on standard output (for `jq`) and the HTTP
    /// status on standard error. Exit code: 0 admitted, 1 denied (429), 2 anything else (a
    /// refused check, no answer).
    Check {
        /// The server's HTTP address.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        server: String,
        #[command(flatten)]
        ask: Ask,
        /// Permits to take.
        #[arg(long, default_value_t = 1)]
        cost: u64,
    },
    /// Loads a running deployment with checks, over HTTP or Envoy's gRPC service, and reports
    /// how many were admitted, denied or failed, the rate and the latency. `{key}` in a path,
    /// header value, key or descriptor value becomes the check's number modulo `--keys`.
    Bench(BenchArgs),
}

/// What `check` and `bench` ask over HTTP: a request to match, or a rule and key.
#[derive(clap::Args)]
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

/// The flags of `bench`.
#[derive(clap::Args)]
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

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| config::log_level().into());
    // LOG_FORMAT=json (the Envoy service's setting): one JSON object a line. A bad value is
    // refused when `serve` reads the settings; until then, text.
    if config::log_json().unwrap_or(false) {
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
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
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
            Command::Validate { files } => Ok(validate(&files)),
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
            } => simulate(
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
            Command::Check { server, ask, cost } => Ok(check(&server, ask.body(cost)?).await),
            Command::Bench(args) => bench(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn simulate(
    pattern: &str,
    algorithms: &[String],
    limit: u64,
    period: &str,
    rate: f64,
    duration: &str,
    window: Option<&str>,
    max_delay: &str,
    chart: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    use tollgate_server::simulate::{Pattern, chart as draw, run, table};
    // A chart that cannot be drawn is said before the run, not after its table.
    if let Some(path) = chart
        && !matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("png" | "svg")
        )
    {
        anyhow::bail!("{}: the chart must be a .png or .svg file", path.display());
    }
    let period = config::parse_duration(period).map_err(anyhow::Error::msg)?;
    let duration = config::parse_duration(duration).map_err(anyhow::Error::msg)?;
    let window = match window {
        Some(w) => config::parse_duration(w).map_err(anyhow::Error::msg)?,
        None => period,
    };
    let max_delay = config::parse_duration(max_delay).map_err(anyhow::Error::msg)?;
    let pattern_name = pattern;
    let pattern = Pattern::parse(pattern).map_err(anyhow::Error::msg)?;
    let arrivals = pattern.arrivals(limit, period, rate, duration);
    let runs = run(algorithms, limit, period, &arrivals, max_delay).map_err(anyhow::Error::msg)?;
    print!("{}", table(&runs, arrivals.len(), limit, window));
    if let Some(path) = chart {
        let title = format!(
            "{pattern_name} traffic, {} requests, against {limit} per {period:?}",
            arrivals.len()
        );
        draw(path, &arrivals, &runs, duration, window, limit, &title)
            .map_err(anyhow::Error::msg)?;
        println!("chart: {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn validate(files: &[PathBuf]) -> ExitCode {
    let checked = config::load(files).and_then(|config| {
        tollgate_server::service::check(&config)?;
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

/// Asks `server` to check `body`; prints the answer. Exit code 0 when admitted, 1 when
/// denied, 2 for any other answer.
async fn check(server: &str, body: serde_json::Value) -> ExitCode {
    let url = bench::check_url(server);
    let answer = async {
        let response = reqwest::Client::new()
            .post(&url)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("cannot reach {url}"))?;
        let status = response.status();
        let text = response.text().await.context("the answer was cut short")?;
        anyhow::Ok((status, text))
    };
    let (status, text) = match answer.await {
        Ok(answer) => answer,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    eprintln!("HTTP {status}");
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(json) => println!("{json:#}"),
        Err(_) => eprintln!("{}", text.trim_end()),
    }
    match status.as_u16() {
        200 => ExitCode::SUCCESS,
        429 => ExitCode::from(1),
        _ => ExitCode::from(2),
    }
}

/// Runs `tollgate bench`; exit code 0 when every check was answered (admitted or denied).
async fn bench(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let target = match (args.grpc, args.domain) {
        (Some(server), Some(domain)) => bench::Target::Grpc {
            server: bench::with_scheme(&server),
            domain,
            entries: bench::entries(&args.descriptor)?,
            cost: args.cost,
        },
        _ => bench::Target::Http {
            server: args.server,
            body: args.ask.body(u64::from(args.cost))?.to_string(),
        },
    };
    let duration = args
        .duration
        .map(|d| config::parse_duration(&d))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let load = bench::Load {
        connections: args.connections,
        requests: args.requests.or(duration.is_none().then_some(10_000)),
        duration,
        rate: args.rate,
        keys: args.keys,
    };
    let report = bench::run(target.clone(), load).await?;
    print!("{}", report.render(&target, &load));
    Ok(if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
