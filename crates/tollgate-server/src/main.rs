//! `tollgate`: the rate limit service and its command line.
//!
//! - `tollgate serve --config FILE...`: HTTP (check, nginx auth_request, admin, metrics) and
//!   Envoy's gRPC rate limit service, reloading the files when they change or on SIGHUP;
//! - `tollgate validate FILE...`: checks rule files, errors with file, line and column;
//! - `tollgate check`: asks a running server about a request or a key;
//! - `tollgate bench`: loads a running deployment and reports its answers and latency.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use notify::{RecursiveMode, Watcher};

use tollgate_server::service::Service;

/// mimalloc: the service allocates per request (bodies, answers, headers), and mimalloc's
/// thread-local free lists make that cheaper than glibc's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use tollgate_server::{bench, config, connections, grpc, http, metrics};

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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| config::log_level().into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
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
            } => serve(config, http, grpc, admin_token, grpc_response_headers)
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

async fn serve(
    files: Vec<PathBuf>,
    http: Option<SocketAddr>,
    grpc: Option<SocketAddr>,
    admin_token: Option<String>,
    grpc_response_headers: bool,
) -> anyhow::Result<()> {
    let files = if files.is_empty() {
        let dir = config::runtime_directory();
        if !dir.is_dir() {
            anyhow::bail!(
                "no rule files: give --config FILE (or a directory), or set RUNTIME_ROOT, \
                 RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY to where the files are ({} \
                 is not a directory)",
                dir.display()
            );
        }
        tracing::info!(dir = %dir.display(), "serving the rule files of the runtime directory");
        vec![dir]
    } else {
        files
    };
    // Installed first: the service registers its counters when it loads the rules.
    let handle = metrics::install()?;
    tokio::spawn(metrics::upkeep(handle.clone()));
    let service = Arc::new(Service::start(files.clone()).await?);
    for name in config::envoy_settings_not_read() {
        tracing::warn!(
            "{name} is set: a setting of envoyproxy/ratelimit that tollgate does not read; it \
             has no effect (README, \"Switching from envoyproxy/ratelimit\", says what does)"
        );
    }
    let server = service.loaded().config.server.clone();
    if let Some((addr, path)) = server.prometheus.clone() {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (PROMETHEUS_ADDR)"))?;
        tracing::info!(addr = %listener.local_addr()?, %path, "metrics listening");
        let (service, handle) = (service.clone(), handle.clone());
        let render = move || {
            let (service, handle) = (service.clone(), handle.clone());
            async move {
                service.observe();
                handle.render()
            }
        };
        let app = axum::Router::new().route(&path, axum::routing::get(render));
        tokio::spawn(async move { axum::serve(listener, app).await });
    }
    let http_addr = http.unwrap_or(server.http);
    let grpc_addr = grpc.or(server.grpc);
    let grpc_response_headers = grpc_response_headers || server.grpc_response_headers;
    let limits = server
        .connections
        .within(connections::raise_descriptor_limit());
    let registry = connections::Registry::new(limits);
    let state = http::AppState {
        service: service.clone(),
        metrics: Some(handle),
        admin_token: admin_token.filter(|t| !t.is_empty()).map(Into::into),
        max_body_bytes: server.max_body_bytes,
        connections: Some(registry.clone()),
    };
    tracing::info!(
        max_connections = limits.max_connections,
        header_timeout = ?limits.header_timeout,
        idle_timeout = ?limits.idle_timeout,
        "connections bounded"
    );
    let listener = tokio::net::TcpListener::bind(http_addr)
        .await
        .with_context(|| format!("cannot listen on {http_addr}"))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let grpc_task = match (grpc_addr, server.grpc_uds.clone()) {
        (None, None) => None,
        (addr, uds) => {
            let svc = grpc::server(
                service.clone(),
                grpc_response_headers,
                server.max_body_bytes,
            );
            let shutdown = stopped(stop_rx.clone());
            let (reporter, health) = tonic_health::server::health_reporter();
            tokio::spawn(grpc::report_health(service.clone(), reporter));
            let mut builder = tonic::transport::Server::builder();
            if let Some(tls) = &server.grpc_tls {
                builder = builder.tls_config(grpc::tls(tls)?)?;
                let mutual = if tls.client_ca.is_some() {
                    "mutual TLS"
                } else {
                    "TLS"
                };
                tracing::info!("gRPC over {mutual}");
            }
            let router = builder
                .layer(grpc::GuardsLayer)
                .add_service(health)
                .add_service(svc);
            match (uds, addr) {
                (Some(path), _) => {
                    // A socket file left by a process that ended is in the way.
                    let _ = std::fs::remove_file(&path);
                    let listener = tokio::net::UnixListener::bind(&path)
                        .with_context(|| format!("cannot listen on {}", path.display()))?;
                    let addr = format!("unix:{}", path.display());
                    tracing::info!(%addr, "gRPC (Envoy rate limit service) listening");
                    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                    Some(tokio::spawn(async move {
                        router
                            .serve_with_incoming_shutdown(incoming, shutdown)
                            .await
                    }))
                }
                (None, Some(addr)) => {
                    let grpc_listener = tokio::net::TcpListener::bind(addr)
                        .await
                        .with_context(|| format!("cannot listen on {addr}"))?;
                    let addr = grpc_listener.local_addr()?;
                    tracing::info!(%addr, "gRPC (Envoy rate limit service) listening");
                    let incoming = connections::incoming(registry.clone(), grpc_listener);
                    Some(tokio::spawn(async move {
                        router
                            .serve_with_incoming_shutdown(incoming, shutdown)
                            .await
                    }))
                }
                (None, None) => None,
            }
        }
    };
    let terminated = terminated()?;
    let hangups = hangups(service.clone())?;
    watch(&files, service.clone());
    tokio::spawn(hangups);
    tokio::spawn(service.clone().follow_shared());
    tracing::info!(addr = %listener.local_addr()?, "HTTP listening");
    let stopping = service.clone();
    tokio::spawn(async move {
        terminated.await;
        stopping.terminate();
        tracing::info!("shutting down: draining requests in flight");
        let _ = stop_tx.send(true);
    });
    let drain = server.drain;
    let http_task = tokio::spawn(http::serve(listener, state, registry, stopped(stop_rx)));
    let finished = async {
        let http = http_task.await;
        let grpc = match grpc_task {
            Some(task) => Some(task.await),
            None => None,
        };
        (http, grpc)
    };
    let (http, grpc) = finished.await;
    http?;
    if let Some(grpc) = grpc {
        grpc??;
    }
    // Pending hybrid counts and unused leases go back to Redis.
    if tokio::time::timeout(drain, service.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("the store did not finish its shutdown within {drain:?}");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGTERM or SIGINT; the handlers are installed when this is called, not when
/// the future is first polled, so a signal right after start is not lost.
fn terminated() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// Reloads the rules on every SIGHUP (the handler is installed when this is called).
fn hangups(service: Arc<Service>) -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup())?;
    Ok(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the rule files");
            let _ = service.reload();
        }
    })
}

/// What a watched event touched: a rule file (or a file of a rule directory), or a symbolic
/// link on the way to one (a deployment that swaps `current` to a new directory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    File,
    Link,
}

/// Watches the rule files' directories and reloads, a moment after the last change, when one
/// of the files changed (editors and config maps replace files rather than write them). A
/// symbolic link on the way to them (`RUNTIME_ROOT` pointing at a deployment's directory) is
/// watched too: when it is swapped, the rules reload from its new target, which is watched
/// from then on. Lives for as long as the process.
fn watch(files: &[PathBuf], service: Arc<Service>) {
    let files = files.to_vec();
    // The first watcher is in place before this returns (before the service says it listens),
    // so that no change after start is missed.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Change>();
    let initial = watcher(&files, tx).map(|w| (w, rx));
    tokio::spawn(async move {
        let mut relinked = false;
        let mut next = initial;
        loop {
            let Some((watching, mut rx)) = next.take() else {
                return;
            };
            if relinked {
                // A file written between the reload and this watcher is read now.
                tracing::info!("watching the new rule directory: reloading");
                let _ = service.reload();
            }
            loop {
                let Some(first) = rx.recv().await else {
                    return;
                };
                // Let a burst of events (write, rename, chmod) settle into one reload.
                tokio::time::sleep(Duration::from_millis(200)).await;
                relinked = first == Change::Link;
                while let Ok(change) = rx.try_recv() {
                    relinked |= change == Change::Link;
                }
                tracing::info!("a rule file changed: reloading");
                let _ = service.reload();
                if relinked {
                    break;
                }
            }
            // Watched again, where the paths lead now.
            drop(watching);
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Change>();
            next = watcher(&files, tx).map(|w| (w, rx));
        }
    });
}

/// A watcher of `files` as they resolve now, telling `tx` of each change.
fn watcher(
    files: &[PathBuf],
    tx: tokio::sync::mpsc::UnboundedSender<Change>,
) -> Option<notify::RecommendedWatcher> {
    let targets: Vec<PathBuf> = files
        .iter()
        .map(|f| std::fs::canonicalize(f).unwrap_or_else(|_| f.clone()))
        .collect();
    let names: Vec<_> = targets
        .iter()
        .filter(|t| !t.is_dir())
        .filter_map(|t| t.file_name().map(|n| n.to_owned()))
        .collect();
    // A directory's every file is a rule file, those added later included.
    let whole: Vec<PathBuf> = targets.iter().filter(|t| t.is_dir()).cloned().collect();
    // The symbolic links on the way to the files, as written.
    let links: Vec<PathBuf> = files
        .iter()
        .flat_map(|f| f.ancestors())
        .filter(|a| a.is_symlink())
        .map(Path::to_path_buf)
        .collect();
    let watched_links = links.clone();
    let handler = move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if event.kind.is_access() {
            return;
        }
        let link = event
            .paths
            .iter()
            .any(|p| watched_links.iter().any(|l| l == p));
        let file = event.paths.iter().any(|p| {
            p.file_name().is_some_and(|n| names.iter().any(|m| m == n))
                || whole.iter().any(|d| p.starts_with(d))
        });
        if link {
            let _ = tx.send(Change::Link);
        } else if file {
            let _ = tx.send(Change::File);
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the rule files; reload with SIGHUP");
            return None;
        }
    };
    let mut dirs: Vec<(PathBuf, RecursiveMode)> = targets
        .iter()
        .filter_map(|t| match t.is_dir() {
            true => Some((t.clone(), RecursiveMode::Recursive)),
            false => t
                .parent()
                .map(|p| (PathBuf::from(p), RecursiveMode::NonRecursive)),
        })
        .chain(links.iter().filter_map(|l| {
            l.parent()
                .map(|p| (p.to_path_buf(), RecursiveMode::NonRecursive))
        }))
        .collect();
    dirs.sort_by(|a, b| a.0.cmp(&b.0));
    dirs.dedup_by(|a, b| a.0 == b.0);
    for (dir, mode) in &dirs {
        if let Err(e) = watcher.watch(dir, *mode) {
            tracing::warn!(error = %e, dir = %dir.display(), "cannot watch; reload with SIGHUP");
        }
    }
    Some(watcher)
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
