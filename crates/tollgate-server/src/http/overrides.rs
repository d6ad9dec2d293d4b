//! The admin API of overrides: a tenant's plan set at run time, without a reload. Every call
//! needs the admin token. `{key}` is percent-encoded; `*` in it matches any run of characters
//! (`acme-*`; `*` alone: every key of the rule). Kept in Redis on a Redis store (every
//! instance applies an edit within a second) or in `server.overrides_file`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::admin::{Admin, edit_error, error};
use super::answers::{ErrorBody, OverrideList};
use crate::config::{OverrideEntry, TierSpec, parse_duration};

/// The overrides' routes, with their documentation.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(show, put, delete))
}

/// Every override in force.
#[utoipa::path(
    get,
    path = "/v1/overrides",
    tag = "admin",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The overrides.", body = OverrideList, example = json!({"overrides": [{"rule": "get-product", "key": "acme", "tiers": [{"limit": 5000, "period": "10s"}], "expires_at": 1799999999u64}]})),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 403, description = "The admin API is off.", body = ErrorBody),
    ),
)]
async fn list(State(state): State<AppState>, _: Admin) -> Response {
    let overrides = crate::config::entries(&state.service.overrides());
    axum::Json(OverrideList { overrides }).into_response()
}

/// One override.
#[utoipa::path(
    get,
    path = "/v1/overrides/{rule}/{key}",
    tag = "admin",
    security(("admin_token" = [])),
    params(
        ("rule" = String, Path, description = "The rule's id.", example = "get-product"),
        ("key" = String, Path, description = "The key or pattern, percent-encoded.", example = "acme"),
    ),
    responses(
        (status = 200, description = "The override.", body = OverrideEntry),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 403, description = "The admin API is off.", body = ErrorBody),
        (status = 404, description = "No override of that rule for that key.", body = ErrorBody),
    ),
)]
async fn show(
    State(state): State<AppState>,
    _: Admin,
    Path((rule, key)): Path<(String, String)>,
) -> Response {
    match state
        .service
        .overrides()
        .remove(&(rule.clone(), key.clone()))
    {
        Some(spec) => axum::Json(OverrideEntry::new(rule, key, spec)).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            format!("no override of `{rule}` for `{key}`"),
        ),
    }
}

/// A plan for a key: the rule's tiers in place of its own, until it expires.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Put {
    /// The tiers, as a rule's (`limit`, `period`, `burst`): every one must admit.
    tiers: Vec<TierSpec>,
    /// How long from now it lasts (`30d`, `1h`); none: until deleted.
    #[schema(example = "30d")]
    expires: Option<String>,
}

/// Sets the override of a rule for a key or a pattern of keys: its tiers in place of the
/// rule's, counted apart from the rule's own counter. Applied at once here, within a second
/// everywhere; audited.
#[utoipa::path(
    put,
    path = "/v1/overrides/{rule}/{key}",
    tag = "admin",
    security(("admin_token" = [])),
    params(
        ("rule" = String, Path, description = "The rule's id: a native rule.", example = "get-product"),
        ("key" = String, Path, description = "The key (as the console shows it) or a pattern (`acme-*`), percent-encoded.", example = "acme"),
    ),
    request_body(content = Put, example = json!({"tiers": [{"limit": 5000, "period": "10s"}], "expires": "30d"})),
    responses(
        (status = 200, description = "Replaced.", body = OverrideEntry),
        (status = 201, description = "Created.", body = OverrideEntry),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 403, description = "The admin API is off.", body = ErrorBody),
        (status = 422, description = "No tiers, tiers the rule's algorithm cannot take, an unknown rule, a bad expiry; nothing changed.", body = ErrorBody),
        (status = 503, description = "Redis (or the overrides file) did not take it; nothing changed.", body = ErrorBody),
    ),
)]
async fn put(
    State(state): State<AppState>,
    _: Admin,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((rule, key)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let put: Put = match serde_json::from_slice(&body) {
        Ok(put) => put,
        Err(e) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("invalid body: {e}"),
            );
        }
    };
    let expires: Option<Duration> = match put.expires.as_deref().map(parse_duration) {
        None => None,
        Some(Ok(d)) if !d.is_zero() => Some(d),
        Some(Ok(_)) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "expires: must be longer than zero",
            );
        }
        Some(Err(e)) => return error(StatusCode::UNPROCESSABLE_ENTITY, format!("expires: {e}")),
    };
    match state
        .service
        .set_override(&rule, &key, Some((put.tiers, expires)))
        .await
    {
        Ok(existed) => {
            super::admin::audited(&state, peer, "override", &rule, Some(&key));
            let spec = state
                .service
                .overrides()
                .remove(&(rule.clone(), key.clone()));
            let Some(spec) = spec else {
                return error(StatusCode::CONFLICT, "the override was removed meanwhile");
            };
            let status = if existed {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            (status, axum::Json(OverrideEntry::new(rule, key, spec))).into_response()
        }
        Err(e) => edit_error(&e),
    }
}

/// Deletes the override of a rule for a key: the rule's own tiers apply again. Audited.
#[utoipa::path(
    delete,
    path = "/v1/overrides/{rule}/{key}",
    tag = "admin",
    security(("admin_token" = [])),
    params(
        ("rule" = String, Path, description = "The rule's id.", example = "get-product"),
        ("key" = String, Path, description = "The key or pattern, percent-encoded.", example = "acme"),
    ),
    responses(
        (status = 204, description = "Deleted."),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 403, description = "The admin API is off.", body = ErrorBody),
        (status = 404, description = "No override of that rule for that key.", body = ErrorBody),
        (status = 503, description = "Redis (or the overrides file) did not take it; nothing changed.", body = ErrorBody),
    ),
)]
async fn delete(
    State(state): State<AppState>,
    _: Admin,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((rule, key)): Path<(String, String)>,
) -> Response {
    if !state
        .service
        .overrides()
        .contains_key(&(rule.clone(), key.clone()))
    {
        return error(
            StatusCode::NOT_FOUND,
            format!("no override of `{rule}` for `{key}`"),
        );
    }
    match state.service.set_override(&rule, &key, None).await {
        Ok(_) => {
            super::admin::audited(&state, peer, "delete override", &rule, Some(&key));
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => edit_error(&e),
    }
}
