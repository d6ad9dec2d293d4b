//! The admin API of the allow and deny lists: keys that bypass a rule, or are refused before
//! it (bans, written by rules with `ban`, are deny entries too). Every call needs the admin
//! token; every edit is audited. `{list}` is `allow` or `deny`, `{rule}` a rule's id or `*`
//! (every rule), `{key}` the key as the console shows it, percent-encoded. Kept in Redis on a
//! Redis store (every instance applies an edit within a second) or in `server.lists_file`.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::admin::{Admin, edit_error, error};
use super::answers::ErrorBody;
use crate::config::{ListEntry, ListKind, parse_duration};

/// The lists' routes, with their documentation.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(put, delete))
}

/// Every entry in force.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ListEntries {
    /// Each entry, allow entries first, by rule and key.
    entries: Vec<ListEntry>,
}

/// Every entry of both lists in force, bans included.
#[utoipa::path(
    get,
    path = "/v1/lists",
    tag = "admin",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The entries.", body = ListEntries, example = json!({"entries": [{"list": "allow", "rule": "*", "key": "10.0.0.7", "reason": "the monitoring probe"}, {"list": "deny", "rule": "get-product", "key": "acme", "expires_at_ms": 1799999999000u64, "reason": "ban"}]})),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 403, description = "The admin API is off.", body = ErrorBody),
    ),
)]
async fn list(State(state): State<AppState>, _: Admin) -> Response {
    let entries = state.service.lists().entries();
    axum::Json(ListEntries { entries }).into_response()
}

/// An entry's settings.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ListSettings {
    /// How long from now it lasts (`10m`, `30d`); none: until deleted.
    #[schema(example = "1h")]
    expires: Option<String>,
    /// Deny entries: the status a refused check answers with, 429 (the default) or 403.
    status: Option<u16>,
    /// Why, in words.
    reason: Option<String>,
}

/// The list of `{list}`, or a 404 answer.
fn kind(list: &str) -> Result<ListKind, Box<Response>> {
    match list {
        "allow" => Ok(ListKind::Allow),
        "deny" => Ok(ListKind::Deny),
        other => Err(Box::new(error(
            StatusCode::NOT_FOUND,
            format!("no list `{other}`: allow or deny"),
        ))),
    }
}

/// Puts a key on a list, for one rule or every rule (`*`): an allowed key bypasses the rule
/// (its checks are admitted, counting nothing), a denied key is refused before it (429, or
/// the entry's `status`, with `Retry-After` until the entry ends). A deny entry wins over an
/// allow entry of the same key. Applied at once here, within a second everywhere; audited.
#[utoipa::path(
    put,
    path = "/v1/lists/{list}/{rule}/{key}",
    tag = "admin",
    security(("admin_token" = [])),
    params(
        ("list" = String, Path, description = "`allow` or `deny`.", example = "deny"),
        ("rule" = String, Path, description = "The rule's id, or `*`: every rule.", example = "get-product"),
        ("key" = String, Path, description = "The key as the console shows it, percent-encoded.", example = "acme"),
    ),
    request_body(content = ListSettings, example = json!({"expires": "1h", "status": 403, "reason": "scraping"})),
    responses(
        (status = 200, description = "Replaced.", body = ListEntry),
        (status = 201, description = "Created.", body = ListEntry),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 403, description = "The admin API is off.", body = ErrorBody),
        (status = 404, description = "No such list.", body = ErrorBody),
        (status = 422, description = "An unknown rule, an empty key, a bad expiry or status, or full lists; nothing changed.", body = ErrorBody),
        (status = 503, description = "Redis (or the lists file) did not take it; nothing changed.", body = ErrorBody),
    ),
)]
async fn put(
    State(state): State<AppState>,
    _: Admin,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((list, rule, key)): Path<(String, String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let list = match kind(&list) {
        Ok(list) => list,
        Err(refused) => return *refused,
    };
    let put: ListSettings = match body.is_empty() {
        true => ListSettings::default(),
        false => match serde_json::from_slice(&body) {
            Ok(put) => put,
            Err(e) => {
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("invalid body: {e}"),
                );
            }
        },
    };
    let expires_at_ms = match put.expires.as_deref().map(parse_duration) {
        None => None,
        Some(Ok(d)) if !d.is_zero() => {
            let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            Some(crate::console::now_micros() / 1_000 + ms)
        }
        Some(Ok(_)) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "expires: must be longer than zero",
            );
        }
        Some(Err(e)) => return error(StatusCode::UNPROCESSABLE_ENTITY, format!("expires: {e}")),
    };
    let entry = ListEntry {
        list,
        rule,
        key,
        expires_at_ms,
        status: put.status,
        reason: put.reason,
    };
    match state.service.set_list_entry(entry.clone(), true).await {
        Ok(existed) => {
            let action = format!("{} list", list.name());
            super::admin::audited(&state, peer, &action, &entry.rule, Some(&entry.key));
            let status = if existed {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            (status, axum::Json(entry)).into_response()
        }
        Err(e) => edit_error(&e),
    }
}

/// Takes a key off a list (a ban ends early this way). Audited.
#[utoipa::path(
    delete,
    path = "/v1/lists/{list}/{rule}/{key}",
    tag = "admin",
    security(("admin_token" = [])),
    params(
        ("list" = String, Path, description = "`allow` or `deny`.", example = "deny"),
        ("rule" = String, Path, description = "The rule's id, or `*`.", example = "get-product"),
        ("key" = String, Path, description = "The key, percent-encoded.", example = "acme"),
    ),
    responses(
        (status = 204, description = "Deleted."),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 403, description = "The admin API is off.", body = ErrorBody),
        (status = 404, description = "No such list, or no entry of that rule and key on it.", body = ErrorBody),
        (status = 503, description = "Redis (or the lists file) did not take it; nothing changed.", body = ErrorBody),
    ),
)]
async fn delete(
    State(state): State<AppState>,
    _: Admin,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((list, rule, key)): Path<(String, String, String)>,
) -> Response {
    let list = match kind(&list) {
        Ok(list) => list,
        Err(refused) => return *refused,
    };
    let entry = ListEntry {
        list,
        rule,
        key,
        expires_at_ms: None,
        status: None,
        reason: None,
    };
    if !state.service.lists().holds(list, &entry.rule, &entry.key) {
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "`{}` is not on the {} list of `{}`",
                entry.key,
                list.name(),
                entry.rule
            ),
        );
    }
    match state.service.set_list_entry(entry.clone(), false).await {
        Ok(_) => {
            let action = format!("delete {} list", list.name());
            super::admin::audited(&state, peer, &action, &entry.rule, Some(&entry.key));
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => edit_error(&e),
    }
}
