//! `GET /v1/regions`: this region, how it hears its peers, and a global rule's use of a key
//! per region (`?rule=&key=`), as this region's Redis holds it.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::admin::{Admin, error};
use super::answers::{ErrorBody, PeerView, RegionUse, RegionsAnswer};

pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(regions))
}

/// Which global rule's use to show.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct UsageQuery {
    /// A global rule's id.
    rule: Option<String>,
    /// The key, with `rule`.
    key: Option<String>,
}

/// This region, its peers, and a global rule's use of a key per region.
#[utoipa::path(
    get,
    path = "/v1/regions",
    tag = "admin",
    security(("admin_token" = [])),
    params(UsageQuery),
    responses(
        (status = 200, description = "This region and its peers; with `rule` and `key`, the key's use per region.", body = RegionsAnswer, example = json!({"region": "us-east", "peers": [{"name": "eu-west", "up": true, "last_heard_ms": 40, "lag_ms": 81, "failures": 0, "pending": 0}], "usage": [[{"region": "eu-west", "admitted": 310}, {"region": "us-east", "admitted": 1204}]]})),
        (status = 400, description = "`rule` without `key`, or the reverse.", body = ErrorBody),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 403, description = "The admin API is off.", body = ErrorBody),
        (status = 404, description = "The store has no regions, or no global rule has that id.", body = ErrorBody),
        (status = 503, description = "This region's Redis did not answer.", body = ErrorBody),
    ),
)]
async fn regions(
    State(state): State<AppState>,
    _: Admin,
    Query(query): Query<UsageQuery>,
) -> Response {
    let Some(regions) = state.service.store().regions() else {
        return error(StatusCode::NOT_FOUND, "the store has no regions");
    };
    let peers = regions
        .peers()
        .into_iter()
        .map(|p| PeerView {
            name: p.name,
            up: !p.failing,
            last_heard_ms: p.last_heard.map(|d| d.as_millis() as u64),
            lag_ms: p.lag.as_millis() as u64,
            failures: p.failures,
            pending: p.pending,
        })
        .collect();
    let usage = match (query.rule, query.key) {
        (None, None) => None,
        (Some(rule), Some(key)) => match state.service.region_usage(&rule, key.as_bytes()).await {
            Ok(Some(tiers)) => Some(
                tiers
                    .into_iter()
                    .map(|tier| {
                        tier.into_iter()
                            .map(|(region, admitted)| RegionUse { region, admitted })
                            .collect()
                    })
                    .collect(),
            ),
            Ok(None) => {
                return error(
                    StatusCode::NOT_FOUND,
                    format!("no global rule has the id `{rule}`"),
                );
            }
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        },
        _ => return error(StatusCode::BAD_REQUEST, "`rule` and `key` go together"),
    };
    axum::Json(RegionsAnswer {
        region: regions.region().into(),
        peers,
        usage,
    })
    .into_response()
}
