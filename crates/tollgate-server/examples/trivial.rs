//! The ceiling of the service benchmark: the same framework (axum on Tokio) answering every
//! `POST /v1/check` with a constant, after reading its body, and deciding nothing.
//!
//! Run: `cargo run --release -p tollgate-server --example trivial -- 127.0.0.1:9000`

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:9000".into());
    let app = Router::new().route(
        "/v1/check",
        post(|body: Bytes| async move {
            let _ = body.len();
            ([("content-type", "application/json")], "{\"allowed\":true}")
        }),
    );
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    axum::serve(listener, app).await
}
