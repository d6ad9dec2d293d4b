//! A multi-tenant service as an axum app behind tollgate's tower layer:
//! per organization (the `X-Org` header), GET a product 1000 times and PUT one 100 times per
//! aligned 10-second window; each organization's flood stays its own. Each method's limit is
//! its method router's `route_layer`, so a method a route does not have (405) spends nothing,
//! and a request without `X-Org` is refused with 400 rather than let through.
//!
//! Run: `cargo run -p tollgate --features tower --example axum_layer`, then
//! `curl -i -H 'x-org: acme' localhost:3000/v1/product/7`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tollgate::layer::{KeyExtractor, RateLimitLayer};
use tollgate::{Algorithm, Limiter, Rule, Tier};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let window = Duration::from_secs(10);
    let get_rule = Rule::new(
        "get-product",
        Algorithm::FixedWindow,
        [Tier::new(1000, window)],
    )?;
    let put_rule = Rule::new(
        "put-product",
        Algorithm::FixedWindow,
        [Tier::new(100, window)],
    )?;
    let per_org = || KeyExtractor::header("x-org");
    let app = Router::new()
        .route(
            "/v1/product/{id}",
            get(|| async { "a product\n" })
                .route_layer(RateLimitLayer::new(Limiter::new(get_rule), per_org())),
        )
        .route(
            "/v1/product/{id}/edit",
            axum::routing::put(|| async { "updated\n" })
                .route_layer(RateLimitLayer::new(Limiter::new(put_rule), per_org())),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://127.0.0.1:3000");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
