//! Permits of concurrency rules over HTTP: a check that a concurrency rule admits holds its
//! slots under a permit (`permit` in its answer, and the `Tollgate-Permit` header field).
//!
//! - `POST /v1/release` with `{"permit": ID}`: gives the slots back; 404 if the permit is
//!   unknown, released already, or ended.
//! - `POST /v1/extend` with `{"permit": ID}`: renews their lease from now.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::answers::{CheckAnswer, ErrorBody};
use super::check::refused;

/// The permit routes, with their documentation.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(release))
        .routes(routes!(extend))
}

/// A permit, as a check's answer gave it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct PermitBody {
    /// The permit's id: 32 hex digits.
    permit: String,
}

/// A permit's body, or why it is not one (422).
fn permit_of(body: &[u8]) -> Result<String, Box<Response>> {
    serde_json::from_slice::<PermitBody>(body)
        .map(|b| b.permit)
        .map_err(|e| {
            Box::new(super::bad_request(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("invalid body: {e} (expected {{\"permit\": \"...\"}})"),
            ))
        })
}

/// Gives back the slots held under a permit: the work is done.
#[utoipa::path(
    post,
    path = "/v1/release",
    tag = "permits",
    request_body(content = PermitBody, example = json!({"permit": "3f0c2b9a7d1e4c5f8a6b0e2d4c6a8e1f"})),
    responses(
        (status = 200, description = "Released: what each key has left.", body = CheckAnswer, example = json!({"allowed": true, "decisions": [{"rule": "exports", "allowed": true, "limit": 5, "remaining": 5, "reset_after_ms": 0, "window_s": 30, "shadowed": false, "source": "memory"}]})),
        (status = 404, description = "No permit holds slots by this id: unknown, released already, or its lease ended (its slots are free).", body = ErrorBody),
        (status = 422, description = "Not a permit's body.", body = ErrorBody),
        (status = 503, description = "The store did not take it: the slots free themselves when their lease ends.", body = ErrorBody),
    ),
)]
async fn release(State(state): State<AppState>, body: axum::body::Bytes) -> Response {
    let permit = match permit_of(&body) {
        Ok(permit) => permit,
        Err(refused) => return *refused,
    };
    match state.service.release(&permit).await {
        Ok(outcome) => super::check::outcome_answer(&outcome, StatusCode::OK, ""),
        Err(e) => refused(e),
    }
}

/// A permit renewed: how long it now lasts.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Extended {
    /// The permit's id.
    permit: String,
    /// Milliseconds until the permit ends, unless extended again.
    expires_in_ms: u64,
}

/// Renews the lease of the slots held under a permit, from now, for as long as it was first
/// given: a holder still at work.
#[utoipa::path(
    post,
    path = "/v1/extend",
    tag = "permits",
    request_body(content = PermitBody, example = json!({"permit": "3f0c2b9a7d1e4c5f8a6b0e2d4c6a8e1f"})),
    responses(
        (status = 200, description = "Renewed.", body = Extended, example = json!({"permit": "3f0c2b9a7d1e4c5f8a6b0e2d4c6a8e1f", "expires_in_ms": 27000})),
        (status = 404, description = "No permit holds slots by this id: unknown, released, or its lease ended.", body = ErrorBody),
        (status = 422, description = "Not a permit's body.", body = ErrorBody),
        (status = 503, description = "The store did not take it: the permit is lost, and its slots free themselves when their lease ends.", body = ErrorBody),
    ),
)]
async fn extend(State(state): State<AppState>, body: axum::body::Bytes) -> Response {
    let permit = match permit_of(&body) {
        Ok(permit) => permit,
        Err(refused) => return *refused,
    };
    match state.service.extend(&permit).await {
        Ok(lasts) => axum::Json(Extended {
            permit,
            expires_in_ms: u64::try_from(lasts.as_millis()).unwrap_or(u64::MAX),
        })
        .into_response(),
        Err(e) => refused(e),
    }
}
