//! The admin API, for self-service rules: `GET /v1/rules` lists the native rules,
//! `GET /v1/rules/{id}` shows one, `PUT /v1/rules/{id}` creates or replaces one (its body a
//! rule as the native file writes it, in JSON or YAML), `DELETE /v1/rules/{id}` removes one.
//! Every call needs `Authorization: Bearer <token>` (the `--admin-token` of `serve`); without a
//! configured token every call is refused. Rules are validated as the files' are; an invalid
//! rule changes nothing. Edits take effect at once and outlive reloads of the files; on a Redis
//! store they are shared with every instance (see [`crate::shared`]).

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::answers::{ErrorBody, RuleList};
use crate::config::parse_rule_spec;
use crate::service::EditError;

/// The admin routes, with their documentation.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(show, put, delete))
}

pub(super) fn edit_error(e: &EditError) -> Response {
    match e {
        EditError::Invalid(_) => error(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
        EditError::Unavailable(_) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(serde_json::json!({ "error": message.into() })),
    )
        .into_response()
}

/// A call that carries the configured bearer token: extracted before anything else of the
/// request (its body included) is read, and refused otherwise.
pub(crate) struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let Some(token) = &state.admin_token else {
            return Err(error(
                StatusCode::FORBIDDEN,
                "the admin API is off: start serve with --admin-token",
            ));
        };
        // The scheme is case-insensitive (RFC 9110, 11.1).
        let given = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        match given {
            Some(given) if constant_time_eq(given.as_bytes(), token.as_bytes()) => Ok(Admin),
            _ => {
                let mut response =
                    error(StatusCode::UNAUTHORIZED, "a valid bearer token is required");
                let bearer = HeaderValue::from_static("Bearer");
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, bearer);
                Err(response)
            }
        }
    }
}

/// Compares without stopping at the first difference, so timing does not leak the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Lists the native rules, from the files and created through this API.
#[utoipa::path(
    get,
    path = "/v1/rules",
    tag = "admin",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The native rules.", body = RuleList, example = json!({"rules": [{"id": "get-product", "enabled": true, "match": {"methods": ["GET"], "path": "/v1/organizations/{org}/product/*"}, "key": ["segment:org", "route", "method"], "algorithm": "fixed_window", "tiers": [{"limit": 1000, "period": "10s"}], "shadow": false, "on_failure": "open"}]})),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 403, description = "The admin API is off: no token is configured.", body = ErrorBody),
    ),
)]
async fn list(State(state): State<AppState>, _: Admin) -> Response {
    let loaded = state.service.loaded();
    axum::Json(serde_json::json!({ "rules": loaded.specs })).into_response()
}

/// One native rule.
#[utoipa::path(
    get,
    path = "/v1/rules/{id}",
    tag = "admin",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The rule's id.", example = "get-product")),
    responses(
        (status = 200, description = "The rule.", body = crate::config::RuleSpec),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 403, description = "The admin API is off.", body = ErrorBody),
        (status = 404, description = "No native rule has that id.", body = ErrorBody),
    ),
)]
async fn show(State(state): State<AppState>, _: Admin, Path(id): Path<String>) -> Response {
    let loaded = state.service.loaded();
    match loaded.specs.iter().find(|s| s.id == id) {
        Some(spec) => axum::Json(spec).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no rule `{id}`")),
    }
}

/// Adds an edit to the console's audit log, when the console is on, and to the log.
pub(super) fn audited(
    state: &AppState,
    peer: SocketAddr,
    action: &str,
    id: &str,
    key: Option<&str>,
) {
    tracing::info!(action, rule = id, key, by = %peer.ip(), "admin edit");
    if let Some(console) = state.service.console() {
        console.audit(crate::console::Audit {
            at: crate::console::now_micros() / 1_000_000,
            action: action.into(),
            rule: id.into(),
            key: key.map(str::to_string),
            by: peer.ip().to_string(),
        });
    }
}

/// Creates or replaces a native rule, validated as the files' are. The edit takes effect at
/// once and outlives reloads; on a Redis store it reaches every instance within a second.
#[utoipa::path(
    put,
    path = "/v1/rules/{id}",
    tag = "admin",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The rule's id; the body's `id` must be the same.", example = "search")),
    request_body(
        description = "The rule as a native file writes it, in JSON or YAML.",
        content = crate::config::RuleSpec,
        example = json!({"id": "search", "match": {"path": "/v1/search"}, "key": ["client_ip"], "algorithm": "gcra", "tiers": [{"limit": 10, "period": "1s", "burst": 20}]}),
    ),
    responses(
        (status = 200, description = "Replaced: the rule as kept.", body = crate::config::RuleSpec),
        (status = 201, description = "Created: the rule as kept.", body = crate::config::RuleSpec),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 403, description = "The admin API is off.", body = ErrorBody),
        (status = 422, description = "The rule, or the rules it would make, are invalid; nothing changed.", body = ErrorBody),
        (status = 503, description = "The Redis that shares the rules did not take the edit; nothing changed.", body = ErrorBody),
    ),
)]
async fn put(
    State(state): State<AppState>,
    _: Admin,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
    body: String,
) -> Response {
    let spec = match parse_rule_spec(&body) {
        Ok(spec) => spec,
        Err(message) => return error(StatusCode::UNPROCESSABLE_ENTITY, message),
    };
    if spec.id != id {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("the body's id `{}` is not the path's `{id}`", spec.id),
        );
    }
    match state.service.edit(&id, Some(spec.clone())).await {
        Ok(true) => {
            audited(&state, peer, "update", &id, None);
            axum::Json(spec).into_response()
        }
        Ok(false) => {
            audited(&state, peer, "create", &id, None);
            (StatusCode::CREATED, axum::Json(spec)).into_response()
        }
        Err(e) => edit_error(&e),
    }
}

/// Deletes a native rule (one from the files stays deleted across reloads).
#[utoipa::path(
    delete,
    path = "/v1/rules/{id}",
    tag = "admin",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The rule's id.", example = "search")),
    responses(
        (status = 204, description = "Deleted."),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 403, description = "The admin API is off.", body = ErrorBody),
        (status = 404, description = "No native rule has that id.", body = ErrorBody),
        (status = 503, description = "The Redis that shares the rules did not take the edit; nothing changed.", body = ErrorBody),
    ),
)]
async fn delete(
    State(state): State<AppState>,
    _: Admin,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
) -> Response {
    if !state.service.loaded().specs.iter().any(|s| s.id == id) {
        return error(StatusCode::NOT_FOUND, format!("no rule `{id}`"));
    }
    match state.service.edit(&id, None).await {
        Ok(_) => {
            audited(&state, peer, "delete", &id, None);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => edit_error(&e),
    }
}
