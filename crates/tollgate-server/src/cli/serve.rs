//! `tollgate serve`: the one entry point of the service. It loads the rule files, opens the
//! store, serves HTTP and gRPC (and, when the Envoy service's settings ask, the metrics on
//! their own listener, the debug listener and a statsd sink), reloads the files when they
//! change or on SIGHUP, and on SIGTERM drains the requests in flight, then hands the store's
//! pending counts and leases back.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use crate::envoy::{self, Envoy, settings};
use crate::net::{connections, tls};
use crate::service::Service;
use crate::{grpc, http, metrics, provider};

/// What `tollgate serve` was asked for on its command line.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Rule files or directories; none: the Envoy service's runtime directory.
    pub files: Vec<PathBuf>,
    /// The HTTP address, instead of the files' `server.http`.
    pub http: Option<SocketAddr>,
    /// The gRPC address, instead of the files' `server.grpc`.
    pub grpc: Option<SocketAddr>,
    /// The admin API's bearer token.
    pub admin_token: Option<String>,
    /// gRPC answers carry the rate limit fields.
    pub grpc_response_headers: bool,
}

/// Serves until SIGTERM or SIGINT, then drains.
///
/// # Errors
/// A file, setting or listener that stops the service before it serves, or a listener
/// that fails while serving.
pub async fn run(options: Options) -> anyhow::Result<()> {
    let Options {
        files,
        http,
        grpc,
        admin_token,
        grpc_response_headers,
    } = options;
    // The Envoy service's settings are read (and refused) before anything starts.
    let settings = settings::from_env()?;
    let xds = settings.xds.clone();
    let files = if files.is_empty() && xds.is_none() {
        let dir = provider::runtime_directory();
        if !dir.is_dir() && !settings.force_start {
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
    let (config, mut pushes, first) = match xds {
        Some(xds) => first_push(&files, xds, settings.force_start).await?,
        None => {
            let config = match provider::load(&files) {
                Ok(config) => config,
                Err(e) if settings.force_start => {
                    tracing::error!(
                        error = %e,
                        "no rules yet (FORCE_START_WITHOUT_INITIAL_CONFIG): serving none until \
                         the files load"
                    );
                    provider::without_files()?
                }
                Err(e) => return Err(e.into()),
            };
            (config, None, None)
        }
    };
    let service = Arc::new(Service::start(files.clone(), config).await?);
    if let Some(pushes) = &mut pushes {
        let texts = match first {
            Some(push) => {
                let _ = push.answer.send(Ok(()));
                push.texts
            }
            None => Vec::new(),
        };
        *service.pushed() = Some(texts);
        let service = service.clone();
        let mut pushes = std::mem::replace(pushes, tokio::sync::mpsc::channel(1).1);
        tokio::spawn(async move {
            while let Some(push) = pushes.recv().await {
                let outcome = provider::apply_push(&service, push.texts).map_err(|e| e.to_string());
                let _ = push.answer.send(outcome);
            }
        });
    }
    let answers = Arc::new(Envoy::new(service.clone()));
    for (name, why) in settings::met_by_design() {
        tracing::info!("{name} is set: {why}; it is not needed");
    }
    let loaded = service.loaded();
    if loaded
        .config
        .places
        .store
        .as_ref()
        .is_some_and(|p| p.file != Path::new("environment"))
        && std::env::var_os("REDIS_URL").is_some()
    {
        tracing::warn!(
            "REDIS_URL and the other REDIS_* settings are not read: a rule file sets `store`"
        );
    }
    drop(loaded);
    if let Some(sink) = settings.statsd.clone() {
        tokio::spawn(envoy::statsd::push(sink));
    }
    if let Some(addr) = settings.debug {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (DEBUG_HOST, DEBUG_PORT)"))?;
        tracing::info!(addr = %listener.local_addr()?, "debug listening");
        let app = envoy::debug::router(service.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
    }
    // Redis is asked at once; while it does not answer, the service serves (the failure
    // policies decide) and says it is unhealthy, asking again as the Envoy service does.
    let (redis_gone_tx, redis_gone) = tokio::sync::oneshot::channel::<anyhow::Error>();
    {
        let service = service.clone();
        let startup = settings.redis_startup;
        tokio::spawn(async move {
            if let Err(e) = service.wait_for_redis(startup).await {
                let _ = redis_gone_tx.send(e);
            }
        });
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
    let admin_token: Option<Arc<str>> = admin_token.filter(|t| !t.is_empty()).map(Into::into);
    if admin_token.is_some() {
        service.enable_console(server.console_record_bytes, server.console_record_always);
        tracing::info!("console on /console (behind the admin token)");
    }
    let state = http::AppState {
        service: service.clone(),
        envoy: answers.clone(),
        metrics: Some(handle),
        admin_token,
        max_body_bytes: server.max_body_bytes,
        connections: Some(registry.clone()),
    };
    tracing::info!(
        max_connections = limits.max_connections,
        header_timeout = ?limits.header_timeout,
        idle_timeout = ?limits.idle_timeout,
        "connections bounded"
    );
    let http_tls = server.tls.as_ref().map(tls::server_config).transpose()?;
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
            let svc = envoy::rls::server(
                answers.clone(),
                grpc_response_headers,
                server.grpc_max_message_bytes,
            );
            let shutdown = stopped(stop_rx.clone());
            let (reporter, health) = tonic_health::server::health_reporter();
            tokio::spawn(grpc::report_health(service.clone(), reporter));
            let mut builder = tonic::transport::Server::builder();
            if let Some((age, grace)) = settings.grpc_max_connection_age {
                builder = builder
                    .max_connection_age(age)
                    .max_connection_age_grace(grace);
            }
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
    provider::watch::watch(&files, service.clone());
    tokio::spawn(hangups);
    tokio::spawn(service.clone().follow_shared());
    tokio::spawn(service.clone().settle_expired());
    tracing::info!(addr = %listener.local_addr()?, tls = http_tls.is_some(), "HTTP listening");
    let stopping = service.clone();
    let (failed_tx, failed) = tokio::sync::oneshot::channel::<anyhow::Error>();
    tokio::spawn(async move {
        tokio::select! {
            () = terminated => {}
            Ok(e) = redis_gone => {
                tracing::error!(error = %format!("{e:#}"), "stopping");
                let _ = failed_tx.send(e);
            }
        }
        stopping.terminate();
        tracing::info!("shutting down: draining requests in flight");
        let _ = stop_tx.send(true);
    });
    let drain = server.drain;
    let http_task = tokio::spawn(http::serve(
        listener,
        state,
        registry,
        http_tls,
        stopped(stop_rx.clone()),
    ));
    let finished = async {
        let http = http_task.await;
        let grpc = match grpc_task {
            Some(task) => Some(task.await),
            None => None,
        };
        (http, grpc)
    };
    // Connections get `drain` to finish once shutdown begins: a client that keeps its
    // connection open past it (one that never reads HTTP/2's GOAWAY, say) does not hold the
    // process up; it is closed as the process exits.
    let overdue = {
        let stopping = stopped(stop_rx.clone());
        async move {
            stopping.await;
            tokio::time::sleep(drain).await;
        }
    };
    tokio::select! {
        (http, grpc) = finished => {
            http?;
            if let Some(grpc) = grpc {
                grpc??;
            }
        }
        () = overdue => {
            tracing::warn!("connections still open after draining for {drain:?}: closing them");
        }
    }
    // Pending hybrid counts and unused leases go back to Redis.
    if tokio::time::timeout(drain, service.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("the store did not finish its shutdown within {drain:?}");
    }
    tracing::info!("stopped");
    let mut failed = failed;
    match failed.try_recv() {
        Ok(e) => Err(e),
        Err(_) => Ok(()),
    }
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
            let _ = provider::reload(&service);
        }
    })
}

/// With `CONFIG_TYPE=GRPC_XDS_SOTW`: subscribes, and, unless `force_start`, waits for the
/// server's first push before anything listens, as the Envoy ratelimit service does. Returns
/// the configuration to start with (the files with the first push, or with no domain when it
/// is invalid, NACKed, or not waited for), the pushes to come, and the first push, to be
/// ACKed once the service started.
async fn first_push(
    files: &[PathBuf],
    xds: crate::config::XdsSettings,
    force_start: bool,
) -> anyhow::Result<(
    crate::config::Config,
    Option<tokio::sync::mpsc::Receiver<provider::xds::Push>>,
    Option<provider::xds::Push>,
)> {
    let server = xds.url.clone();
    let mut pushes = provider::xds::spawn(xds);
    let none = || provider::load_with(files, Some(&[]));
    if force_start {
        tracing::info!(%server, "serving no Envoy domain until the xDS server's first push (FORCE_START_WITHOUT_INITIAL_CONFIG)");
        return Ok((none()?, Some(pushes), None));
    }
    tracing::info!(%server, "waiting for the xDS server's first push before serving");
    let Some(push) = pushes.recv().await else {
        anyhow::bail!("the xDS subscription ended before its first push");
    };
    match provider::load_with(files, Some(&push.texts)) {
        Ok(config) => Ok((config, Some(pushes), Some(push))),
        Err(e) => {
            // As there: an invalid first push is refused, and the service starts without it.
            let _ = push.answer.send(Err(e.to_string()));
            Ok((none()?, Some(pushes), None))
        }
    }
}
