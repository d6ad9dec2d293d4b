//! The Envoy ratelimit service's debug listener (`DEBUG_HOST`, `DEBUG_PORT`): `/rlconfig`,
//! the limits loaded now, one line each as it prints them; `/stats`, its statistics and their
//! counts under their statsd names; `/`, the list of these. Opened only when asked for (that
//! service always opens it, on 6070).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::routing::get;

use crate::metrics::statsd;
use crate::service::Service;

/// The endpoints, with what each shows.
const ENDPOINTS: [(&str, &str); 2] = [
    (
        "/rlconfig",
        "print out the currently loaded configuration for debugging",
    ),
    ("/stats", "print out stats"),
];

/// The debug listener's routes over `service`.
pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/rlconfig", get(rlconfig))
        .route("/stats", get(stats))
        .with_state(service)
}

async fn index() -> String {
    ENDPOINTS
        .iter()
        .map(|(path, help)| format!("{path}: {help}\n"))
        .collect()
}

async fn rlconfig(State(service): State<Arc<Service>>) -> String {
    let loaded = service.loaded();
    loaded.engine.domains().map(|d| d.dump()).collect()
}

async fn stats() -> String {
    statsd::snapshot()
        .into_iter()
        .map(|(name, count)| format!("{name}: {count}\n"))
        .collect()
}
