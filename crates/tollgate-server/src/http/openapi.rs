//! The OpenAPI document of the HTTP API, served at `GET /v1/openapi.json`. Routes are
//! registered with their documentation (`utoipa_axum::routes!`), so that a route cannot be
//! served without being described; the two checks, served before the router, are added here.
//! The answers the handlers write by hand are described by the types of `answers.rs`.

use std::sync::OnceLock;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::AppState;

/// The document's parts that no route carries: what the API is, its tags, the admin token,
/// and the checks served before the router.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "tollgate",
        description = "The HTTP API of the tollgate rate limit service: checks (`/v1/check`, \
                       `/v1/auth`), the admin API (`/v1/rules`), the console's API \
                       (`/v1/console/...`), health and metrics, and the Envoy ratelimit \
                       service's `/healthcheck` and `/json`. Every answer about a limit carries \
                       `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`, \
                       `RateLimit-Policy`, `RateLimit`, and `Retry-After` when denied.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(super::check::check, super::check::auth),
    tags(
        (name = "checks", description = "Asked before doing work: is this request within its limits?"),
        (name = "metered", description = "Work whose cost is known once it is done (an LLM answer's tokens): reports, and reservations settled at the real cost."),
        (name = "permits", description = "Slots of concurrency rules held under a permit from a check: released when the work is done, extended while it goes on."),
        (name = "admin", description = "Rules created, replaced and deleted at run time, behind the admin token."),
        (name = "console", description = "The console's page and JSON API: on only with an admin token (404 otherwise), behind it."),
        (name = "health", description = "Liveness, readiness, metrics, and this document."),
        (name = "envoy", description = "The Envoy ratelimit service's own HTTP surfaces."),
    ),
    modifiers(&AdminToken),
)]
pub(super) struct Document;

/// The admin token as a security scheme: `Authorization: Bearer <token>`.
struct AdminToken;

impl Modify for AdminToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The token `serve --admin-token` (or `TOLLGATE_ADMIN_TOKEN`) sets; without \
                         one, the admin API answers 403 and the console 404.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document, made once from the routes `router` built.
static DOCUMENT: OnceLock<String> = OnceLock::new();

/// Keeps the document of the routes, the first time the router is made.
pub(super) fn keep(document: utoipa::openapi::OpenApi) {
    DOCUMENT.get_or_init(|| document.to_pretty_json().unwrap_or_default());
}

/// The OpenAPI document of the HTTP API.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "health",
    responses((status = 200, description = "This document (OpenAPI 3.1).", content_type = "application/json", body = Object)),
)]
pub(super) async fn document(State(_): State<AppState>) -> Response {
    let text = DOCUMENT.get().cloned().unwrap_or_default();
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        text,
    )
        .into_response()
}
