//! Metered work over HTTP: costs known once the work is done (an LLM answer's tokens).
//!
//! - `POST /v1/report`: a check's body whose `cost` is the work's; takes it whatever the keys'
//!   state, and answers 200 with what each key has left (`allowed: false` once in debt).
//! - `POST /v1/reservations`: a check's body whose `cost` is an estimate, and an optional
//!   `ttl`; decided as a check: 200 with the reservation's `id`, or 429.
//! - `POST /v1/reservations/{id}/commit` with `{"cost": N}`: settles at the real cost.
//! - `DELETE /v1/reservations/{id}`: cancels; the estimate comes back.
//!
//! Every answer carries the rate limit header fields, as a check's does.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::answers::{CheckAnswer, ErrorBody, ReservationAnswer};
use super::check::{Asked, json_body, outcome_answer, parsed, refused};

/// The metered routes, with their documentation.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(report))
        .routes(routes!(reserve))
        .routes(routes!(commit))
        .routes(routes!(cancel))
}

/// Takes the cost of work done, whatever the keys' state: past a limit the key is in debt, and
/// its checks are denied until time pays the debt back. Never refused for being over a limit.
#[utoipa::path(
    post,
    path = "/v1/report",
    tag = "metered",
    request_body(
        description = "A check's body (a request, or a rule and a key): `cost` is what the work used.",
        content = super::check::CheckBody,
        example = json!({"rule": "get-product", "key": "acme", "cost": 1200}),
    ),
    responses(
        (status = 200, description = "Taken: what each key has left (`allowed: false` while in debt, with `retry_after_ms` until it is paid back).", body = CheckAnswer, example = json!({"allowed": false, "decisions": [{"rule": "get-product", "allowed": false, "limit": 1000, "remaining": 0, "reset_after_ms": 8000, "retry_after_ms": 8000, "window_s": 10, "shadowed": false, "source": "memory"}]})),
        (status = 400, description = "Not a report: an unknown rule, a bad key, a cost of 2^53 or more, descriptors.", body = ErrorBody),
        (status = 403, description = "A `limit` stated, and no rule the report applies to takes one: nothing counted.", body = ErrorBody),
        (status = 415, description = "Not `application/json`.", body = ErrorBody),
        (status = 422, description = "JSON of the wrong shape.", body = ErrorBody),
        (status = 501, description = "The store takes no reports (hybrid, lease).", body = ErrorBody),
        (status = 503, description = "The store did not take it (Redis failing): nothing was counted, and nothing is made up; report again.", body = ErrorBody),
    ),
)]
async fn report(State(state): State<AppState>, request: axum::extract::Request) -> Response {
    let bytes = match json_body(&state, request).await {
        Ok(bytes) => bytes,
        Err(refused) => return refused,
    };
    let body = match parsed(&bytes) {
        Ok(body) => body,
        Err(refused) => return refused.into_response(),
    };
    let trusted = state.service.loaded().config.server.trusted_proxies.clone();
    let (asked, cost, ttl) = match Asked::of(&body, &trusted) {
        Ok(asked) => asked,
        Err(refused) => return refused.into_response(),
    };
    if ttl.is_some() {
        return super::bad_request(StatusCode::BAD_REQUEST, "`ttl` is for /v1/reservations");
    }
    match state
        .service
        .report(asked.target(), cost, body.limit.as_ref())
        .await
    {
        Ok(outcome) => outcome_answer(&outcome, StatusCode::OK, ""),
        Err(e) => refused(e),
    }
}

/// Reserves an estimate before the work, decided as a check (all-or-nothing across the rules
/// that apply). Settle it with its `id` once the real cost is known; unsettled within its time
/// to live, it settles by itself as its rules say: consumed at its estimate (the default), or
/// released.
#[utoipa::path(
    post,
    path = "/v1/reservations",
    tag = "metered",
    request_body(
        description = "A check's body: `cost` is the estimate; `ttl` how long it lives unsettled.",
        content = super::check::CheckBody,
        example = json!({"rule": "get-product", "key": "acme", "cost": 10, "ttl": "2m"}),
    ),
    responses(
        (status = 200, description = "Reserved: the estimate is taken until the reservation is settled.", body = ReservationAnswer, example = json!({"id": "3f0c2b9a7d1e4c5f8a6b0e2d4c6a8e1f", "expires_in_ms": 120000, "allowed": true, "decisions": [{"rule": "get-product", "allowed": true, "limit": 1000, "remaining": 990, "reset_after_ms": 9400, "window_s": 10, "shadowed": false, "source": "memory"}]})),
        (status = 429, description = "Denied as a check would be: nothing taken, no id.", body = ReservationAnswer),
        (status = 400, description = "Not a reservation: an unknown rule, a bad key or ttl, a cost no tier can admit.", body = ErrorBody),
        (status = 403, description = "A `limit` stated, and no rule the reservation applies to takes one: nothing taken.", body = ErrorBody),
        (status = 415, description = "Not `application/json`.", body = ErrorBody),
        (status = 422, description = "JSON of the wrong shape.", body = ErrorBody),
        (status = 501, description = "The store takes no reservations (hybrid, lease).", body = ErrorBody),
        (status = 503, description = "The store holds its most open reservations, or did not keep this one: nothing is taken.", body = ErrorBody),
    ),
)]
async fn reserve(State(state): State<AppState>, request: axum::extract::Request) -> Response {
    let bytes = match json_body(&state, request).await {
        Ok(bytes) => bytes,
        Err(refused) => return refused,
    };
    let body = match parsed(&bytes) {
        Ok(body) => body,
        Err(refused) => return refused.into_response(),
    };
    let trusted = state.service.loaded().config.server.trusted_proxies.clone();
    let (asked, cost, ttl) = match Asked::of(&body, &trusted) {
        Ok(asked) => asked,
        Err(refused) => return refused.into_response(),
    };
    match state
        .service
        .reserve(asked.target(), cost, ttl, body.limit.as_ref())
        .await
    {
        Ok(reserved) => {
            let status = match reserved.outcome.allowed() {
                true => StatusCode::OK,
                false => StatusCode::TOO_MANY_REQUESTS,
            };
            let before = match &reserved.id {
                // Ids are hex digits: nothing to escape.
                Some(id) => format!(
                    "\"id\":\"{id}\",\"expires_in_ms\":{},",
                    reserved.expires_in.as_millis()
                ),
                None => "\"id\":null,".to_string(),
            };
            outcome_answer(&reserved.outcome, status, &before)
        }
        Err(e) => refused(e),
    }
}

/// The real cost of reserved work.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Commit {
    /// What the work used: less than the estimate gives the difference back, more takes the
    /// excess.
    cost: u64,
}

/// Settles a reservation at the work's real cost: less than the estimate gives the difference
/// back where the algorithm can, more takes the excess as a report does. Once only.
#[utoipa::path(
    post,
    path = "/v1/reservations/{id}/commit",
    tag = "metered",
    params(("id" = String, Path, description = "The reservation's id.", example = "3f0c2b9a7d1e4c5f8a6b0e2d4c6a8e1f")),
    request_body(content = Commit, example = json!({"cost": 7})),
    responses(
        (status = 200, description = "Settled: what each key has left.", body = CheckAnswer),
        (status = 404, description = "No open reservation has this id: unknown, settled, or expired.", body = ErrorBody),
        (status = 400, description = "A cost of 2^53 or more.", body = ErrorBody),
        (status = 422, description = "Not a commit's body.", body = ErrorBody),
        (status = 503, description = "The store did not take it: the reservation is settled, and the difference may be lost.", body = ErrorBody),
    ),
)]
async fn commit(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let commit: Commit = match serde_json::from_slice(&body) {
        Ok(commit) => commit,
        Err(e) => {
            return super::bad_request(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("invalid body: {e} (expected {{\"cost\": N}})"),
            );
        }
    };
    match state.service.commit(&id, commit.cost).await {
        Ok(outcome) => outcome_answer(&outcome, StatusCode::OK, ""),
        Err(e) => refused(e),
    }
}

/// Cancels a reservation: its estimate comes back where the algorithm can.
#[utoipa::path(
    delete,
    path = "/v1/reservations/{id}",
    tag = "metered",
    params(("id" = String, Path, description = "The reservation's id.", example = "3f0c2b9a7d1e4c5f8a6b0e2d4c6a8e1f")),
    responses(
        (status = 200, description = "Cancelled: what each key has left.", body = CheckAnswer),
        (status = 404, description = "No open reservation has this id: unknown, settled, or expired.", body = ErrorBody),
        (status = 503, description = "The store did not take it.", body = ErrorBody),
    ),
)]
async fn cancel(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    match state.service.cancel(&id).await {
        Ok(outcome) => outcome_answer(&outcome, StatusCode::OK, ""),
        Err(e) => refused(e),
    }
}
