//! The gRPC listener: what it does around every call (see [`GuardsLayer`]), its TLS, and the
//! standard health service. The rate limit service it serves is Envoy's
//! (`crate::envoy::rls`).

use std::sync::Arc;

use crate::net::connections::{ConnectInfo, InFlight};
use crate::service::Service;

/// What the gRPC listener does around the service, in one layer so that a call pays for one
/// wrapping future, not boxed: it marks each call in flight on its connection (see
/// [`crate::net::connections`]), so that a busy connection is neither idle nor evicted; and it
/// answers a call whose message cannot be decoded with `INVALID_ARGUMENT`, where tonic says
/// `INTERNAL`: the caller's mistake, not the service's (such answers carry their status in
/// their headers, trailers-only).
#[derive(Debug, Clone, Copy, Default)]
pub struct GuardsLayer;

impl<S> tower::Layer<S> for GuardsLayer {
    type Service = Guards<S>;

    fn layer(&self, inner: S) -> Guards<S> {
        Guards(inner)
    }
}

/// See [`GuardsLayer`].
#[derive(Debug, Clone)]
pub struct Guards<S>(S);

impl<S, B, R> tower::Service<axum::http::Request<B>> for Guards<S>
where
    S: tower::Service<axum::http::Request<B>, Response = axum::http::Response<R>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Guarded<S::Future>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let extensions = request.extensions();
        let in_flight = extensions
            .get::<ConnectInfo>()
            .or_else(|| {
                extensions
                    .get::<tonic::transport::server::TlsConnectInfo<ConnectInfo>>()
                    .map(|tls| tls.get_ref())
            })
            .map(|c| c.tracked.begin());
        Guarded {
            answer: self.0.call(request),
            in_flight,
        }
    }
}

pin_project_lite::pin_project! {
    /// The answer of a call through [`Guards`].
    #[derive(Debug)]
    pub struct Guarded<F> {
        #[pin]
        answer: F,
        in_flight: Option<InFlight>,
    }
}

impl<F, R, E> std::future::Future for Guarded<F>
where
    F: std::future::Future<Output = Result<axum::http::Response<R>, E>>,
{
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.project();
        let mut answer = std::task::ready!(this.answer.poll(cx));
        this.in_flight.take();
        if let Ok(answer) = &mut answer {
            let headers = answer.headers_mut();
            // The message is percent-encoded.
            let undecodable = headers.get("grpc-status").is_some_and(|s| s == "13")
                && headers
                    .get("grpc-message")
                    .is_some_and(|m| m.as_bytes().starts_with(b"failed%20to%20decode%20Protobuf"));
            if undecodable {
                let invalid = axum::http::HeaderValue::from_static("3");
                headers.insert("grpc-status", invalid);
            }
        }
        std::task::Poll::Ready(answer)
    }
}

/// The TLS settings of the gRPC listener from `tls`'s files.
///
/// # Errors
/// A file that cannot be read, named.
pub fn tls(tls: &crate::config::TlsFiles) -> anyhow::Result<tonic::transport::ServerTlsConfig> {
    use anyhow::Context as _;
    let read = |path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
    };
    let identity = tonic::transport::Identity::from_pem(read(&tls.cert)?, read(&tls.key)?);
    let mut config = tonic::transport::ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &tls.client_ca {
        config = config.client_ca_root(tonic::transport::Certificate::from_pem(read(ca)?));
    }
    Ok(config)
}

/// Keeps the gRPC health service (`grpc.health.v1.Health`) saying what the Envoy service's
/// says: the server (`""`) and `ratelimit` are serving while the service is healthy (see
/// [`Service::healthy`]); checked every 250 ms, for as long as the process runs.
pub async fn report_health(service: Arc<Service>, reporter: tonic_health::server::HealthReporter) {
    let mut serving = None;
    let mut every = tokio::time::interval(std::time::Duration::from_millis(250));
    loop {
        every.tick().await;
        let healthy = service.healthy();
        if serving != Some(healthy) {
            let status = if healthy {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            for name in ["", "ratelimit"] {
                reporter.set_service_status(name, status).await;
            }
            serving = Some(healthy);
        }
    }
}
