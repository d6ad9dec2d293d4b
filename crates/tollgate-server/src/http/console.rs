//! The console's page and JSON API, on the HTTP listener when an admin token is configured;
//! every API call needs `Authorization: Bearer <token>`, as the admin API does.
//!
//! - `GET /console`: the page (and `/console/app.js`, `/console/app.css`); it asks for the
//!   token and keeps it for the browser tab only.
//! - `GET /v1/console/overview`: decisions per second (allowed, denied, denied in shadow) for
//!   two minutes, the rate over 10 s, p50/p99 check latency over a minute, the store and its
//!   health, the rule files and their load status, the instances on the same Redis, what the
//!   recorder holds.
//! - `GET /v1/console/rules`: every rule (native and Envoy) with what it matches, its key,
//!   algorithm, tiers, shadow and failure policy, its rate, denials per minute and the largest
//!   share of its limit a key uses; with the other instances' rates on a Redis store.
//! - `GET /v1/console/rules/{id}`: one rule, its decisions per second (2 min) and per minute
//!   (1 h), its hottest keys by hits and by denials, each with what it has left now.
//! - `POST /v1/console/rules/{id}/reset` (`{"key": "..."}`): forgets one key's count; audited.
//! - `POST /v1/console/validate` (a rule in YAML or JSON): the rule, or its error at the line
//!   and column of the field.
//! - `POST /v1/console/preview` (`{"rule": "<YAML>", "minutes": 5}`): the requests recorded
//!   lately replayed through the rule (and through the rule of that id in use now, if any).
//! - `POST /v1/console/explain` (`{"request": {...}, "cost": 1}` or `{"rule", "key"}`): the
//!   rules that match, their keys and state, the decision and the headers, consuming nothing.
//! - `GET /v1/console/audit`: the admin actions taken here, newest first.

use std::net::SocketAddr;
use std::path::Path as FilePath;
use std::time::Duration;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tollgate::engine::{Hit, Request};
use tollgate::{AnyStore, Decision, Item, Rule};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::admin::Admin;
use super::answers::{
    AuditLog, ConsoleRule, ConsoleRules, ErrorBody, Explained, Overview, PlacedError,
    PreviewAnswer, Validated,
};
use crate::config::{RuleSpec, parse_rule_text};
use crate::console::{Audit, Recent, RuleView};

const PAGE: &str = include_str!("../console/assets/index.html");
const SCRIPT: &str = include_str!("../console/assets/app.js");
const STYLE: &str = include_str!("../console/assets/app.css");

/// The console's routes, with their documentation.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(page))
        .routes(routes!(page_in))
        .routes(routes!(script))
        .routes(routes!(style))
        .routes(routes!(overview))
        .routes(routes!(rules))
        .routes(routes!(rule))
        .routes(routes!(reset))
        .routes(routes!(validate))
        .routes(routes!(preview))
        .routes(routes!(explain))
        .routes(routes!(audit))
}

/// The page's own files only: no inline script, nothing from elsewhere.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                      connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                      frame-ancestors 'none'; form-action 'none'";

fn asset(kind: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The console's page: it asks for the admin token and keeps it for the browser tab only.
#[utoipa::path(get, path = "/console", tag = "console", responses((status = 200, description = "The page.", content_type = "text/html", body = String)))]
async fn page() -> Response {
    asset("text/html; charset=utf-8", PAGE)
}

/// The console's page, as `/console`.
#[utoipa::path(get, path = "/console/", tag = "console", responses((status = 200, description = "The page.", content_type = "text/html", body = String)))]
async fn page_in() -> Response {
    page().await
}

/// The page's script.
#[utoipa::path(get, path = "/console/app.js", tag = "console", responses((status = 200, description = "The script.", content_type = "text/javascript", body = String)))]
async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// The page's style.
#[utoipa::path(get, path = "/console/app.css", tag = "console", responses((status = 200, description = "The style sheet.", content_type = "text/css", body = String)))]
async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": message.into() }))).into_response()
}

/// The console, or 404 when it is off.
macro_rules! console {
    ($state:expr) => {
        match $state.service.console() {
            Some(console) => {
                console.used();
                console.clone()
            }
            None => return error(StatusCode::NOT_FOUND, "the console is off"),
        }
    };
}

/// A period as rule files write it.
/// A tier's period as the console shows it: a duration, or a calendar unit in its zone.
fn period(t: &tollgate::Tier) -> String {
    match t.calendar_period() {
        Some(c) if c.zone() == "UTC" => c.unit().name().to_string(),
        Some(c) => format!("{} ({})", c.unit().name(), c.zone()),
        None => span(t.period()),
    }
}

fn span(d: Duration) -> String {
    let s = d.as_secs();
    match () {
        _ if d.subsec_nanos() != 0 => format!("{}ms", d.as_millis()),
        _ if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        _ if s.is_multiple_of(3_600) => format!("{}h", s / 3_600),
        _ if s.is_multiple_of(60) => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

/// Decisions per second, latency, the store and its health, the rule files, the instances.
#[utoipa::path(
    get,
    path = "/v1/console/overview",
    tag = "console",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The overview.", body = Overview),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 404, description = "The console is off (no admin token), or no rule has the id named.", body = ErrorBody),
    ),
)]
async fn overview(State(state): State<AppState>, _: Admin) -> Response {
    let console = console!(state);
    let service = &state.service;
    let now = console.now() / 1_000_000;
    let last = console.last(now, 10);
    let (p50, p99) = console.latency(now, 60);
    let store = service.store();
    let held = console.recorded();
    let recording = console.recording();
    let mut instances = vec![json!({
        "id": console.instance,
        "version": env!("CARGO_PKG_VERSION"),
        "started": console.started,
        "seen": now,
        "rate": last.total() as f64 / 10.0,
        "self": true,
    })];
    for peer in console.peers() {
        instances.push(json!({
            "id": peer.id,
            "version": peer.version,
            "started": peer.started,
            "seen": peer.seen,
            "rate": peer.rate,
            "self": false,
        }));
    }
    axum::Json(json!({
        "instance": console.instance,
        "version": env!("CARGO_PKG_VERSION"),
        "started": console.started,
        "now": now,
        "rate": {
            "allowed": last.allowed as f64 / 10.0,
            "denied": last.denied as f64 / 10.0,
            "shadow": last.shadow as f64 / 10.0,
        },
        "latency": { "p50_us": p50, "p99_us": p99 },
        "seconds": console.seconds(now),
        "store": store_health(store).await,
        "files": crate::provider::files_of(service.sources())
            .unwrap_or_else(|_| service.sources().to_vec()),
        "status": service.status(),
        "instances": instances,
        "recorder": {
            "requests": held.requests,
            "bytes": held.bytes,
            "dropped": held.dropped,
            "since": held.oldest.map(|at| at / 1_000_000),
            "recording": recording.0,
            "until": recording.1.map(|at| at / 1_000_000),
        },
    }))
    .into_response()
}

/// The store's kind and health; on Redis, the round trip of a `PING` now (at most a second).
async fn store_health(store: &AnyStore) -> Value {
    let mut health = json!({ "kind": store.kind() });
    if let AnyStore::Memory(memory) = store {
        health["keys"] = json!(memory.keys());
        health["bytes"] = json!(memory.bytes());
    }
    if let Some(failures) = store.failures() {
        health["degraded"] = json!(store.degraded());
        health["failures"] = json!({ "errors": failures.errors, "timeouts": failures.timeouts });
    }
    if let Some(redis) = store.redis() {
        let asked = std::time::Instant::now();
        let pong = tokio::time::timeout(Duration::from_secs(1), redis.ping()).await;
        health["ping"] = match pong {
            Ok(Ok(())) => json!({ "us": asked.elapsed().as_micros() as u64 }),
            Ok(Err(e)) => json!({ "error": e.to_string() }),
            Err(_) => json!({ "error": "no answer within 1 s" }),
        };
    }
    if let AnyStore::Redis(redis) = store {
        health["down"] = json!(redis.down());
        health["nodes"] = json!(
            redis
                .nodes()
                .iter()
                .map(|n| json!({ "address": n.address, "slots": n.slots, "failing": n.failing }))
                .collect::<Vec<_>>()
        );
    }
    health
}

/// What a rule is, for the list and the detail.
fn describe(rule: &Rule, spec: Option<&RuleSpec>, admin: bool, store: &str) -> Value {
    let tiers: Vec<Value> = rule
        .tiers()
        .iter()
        .map(|t| {
            let mut tier = json!({ "limit": t.limit(), "period": period(t) });
            if rule.algorithm().name() != "hit_counter" && t.burst() != t.limit() {
                tier["burst"] = json!(t.burst());
            }
            tier
        })
        .collect();
    let policy = match rule.failure_policy() {
        tollgate::FailurePolicy::Open => "open".to_string(),
        tollgate::FailurePolicy::Closed => "closed".to_string(),
        tollgate::FailurePolicy::Local { share } => format!("local:{share}"),
    };
    let source = match (spec, admin) {
        (Some(_), true) => "admin",
        (Some(_), false) => "file",
        (None, _) => "envoy",
    };
    json!({
        "id": rule.name(),
        "source": source,
        "algorithm": spec.map_or_else(|| rule.algorithm().name().to_string(), |s| s.algorithm.clone()),
        "tiers": tiers,
        "shadow": rule.is_shadow(),
        "on_failure": policy,
        "store": store,
        "enabled": spec.is_none_or(|s| s.enabled),
        "match": spec.map(|s| serde_json::to_value(&s.matcher).unwrap_or_default()),
        "key": spec.map(|s| s.key.clone()),
    })
}

/// Every rule, native and Envoy's, with its rate, denials and the share of its limit in use.
#[utoipa::path(
    get,
    path = "/v1/console/rules",
    tag = "console",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The rules.", body = ConsoleRules),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 404, description = "The console is off (no admin token), or no rule has the id named.", body = ErrorBody),
    ),
)]
async fn rules(State(state): State<AppState>, _: Admin) -> Response {
    let console = console!(state);
    let loaded = state.service.loaded();
    let admin = state.service.admin_ids();
    let now = console.now() / 1_000_000;
    let peers = console.peers();
    let kind = state.service.store().kind();
    let recent = console.recent(now);
    let list: Vec<Value> = loaded
        .engine
        .rules()
        .map(|rule| {
            let spec = loaded.specs.iter().find(|s| s.id == rule.name());
            let mut value = describe(rule, spec, admin.contains(rule.name()), kind);
            let Recent {
                last10,
                last60,
                in_use,
            } = recent.get(rule.name()).copied().unwrap_or_default();
            let others: u64 = peers
                .iter()
                .flat_map(|p| &p.rules)
                .filter(|(name, _)| name == rule.name())
                .map(|(_, c)| c.total())
                .sum();
            value["rate"] = json!(last10.total() as f64 / 10.0);
            value["denied_per_minute"] = json!(last60.denied);
            value["shadow_per_minute"] = json!(last60.shadow);
            value["in_use"] = json!(in_use);
            value["all_instances_per_minute"] = json!(last60.total() + others);
            value
        })
        .collect();
    axum::Json(json!({ "rules": list })).into_response()
}

/// One rule: decisions per second and per minute, its hottest keys with what each has left
/// (and, for a global rule, what each region admitted of it in this window).
#[utoipa::path(
    get,
    path = "/v1/console/rules/{id}",
    tag = "console",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The rule's id.", example = "get-product")),
    responses(
        (status = 200, description = "The rule.", body = ConsoleRule),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 404, description = "The console is off (no admin token), or no rule has the id named.", body = ErrorBody),
    ),
)]
async fn rule(State(state): State<AppState>, _: Admin, Path(id): Path<String>) -> Response {
    let console = console!(state);
    let loaded = state.service.loaded();
    let Some(found) = loaded.engine.rules().find(|r| r.name() == id) else {
        return error(StatusCode::NOT_FOUND, format!("no rule `{id}`"));
    };
    let spec = loaded.specs.iter().find(|s| s.id == id).cloned();
    let admin = state.service.admin_ids().contains(&id);
    let described = describe(found, spec.as_ref(), admin, state.service.store().kind());
    // A concurrency rule's keys show their slots in use.
    let found_slots = found.algorithm().holds_slots();
    let global = matches!(found.scope_of(), tollgate::Scope::Global(_));
    let yaml = spec.as_ref().and_then(|s| serde_saphyr::to_string(s).ok());
    let now = console.now() / 1_000_000;
    let RuleView {
        seconds,
        minutes,
        hits,
        denials,
    } = console.rule(&id, now, 10).unwrap_or_default();
    drop(loaded);
    // What each hot key has left now: a look, which consumes nothing.
    let mut annotate = Vec::new();
    for list in [&hits, &denials] {
        let mut out = Vec::new();
        for hot in list.iter() {
            let mut value = serde_json::to_value(hot).unwrap_or_default();
            value["display"] = json!(crate::console::readable(&hot.key));
            if !hot.cut
                && let Ok(outcome) = state.service.check_key(&id, &hot.key, 0, None).await
                && let Some(d) = outcome.decisions.first()
            {
                value["remaining"] = json!(d.remaining());
                value["limit"] = json!(d.limit());
                if found_slots {
                    value["in_use"] = json!(d.limit() - d.remaining());
                }
                value["reset_after_s"] = json!(d.reset_after().as_secs_f64());
            }
            // A global rule's key: what each region admitted of it in this window.
            if global
                && !hot.cut
                && let Ok(Some(tiers)) = state.service.region_usage(&id, &hot.key).await
                && let Some(first) = tiers.first()
            {
                let by_region: Vec<_> = first
                    .iter()
                    .map(|(region, admitted)| json!({"region": region, "admitted": admitted}))
                    .collect();
                value["regions"] = json!(by_region);
            }
            out.push(value);
        }
        annotate.push(out);
    }
    let denials = annotate.pop().unwrap_or_default();
    let hits = annotate.pop().unwrap_or_default();
    axum::Json(json!({
        "rule": described,
        "spec": spec,
        "yaml": yaml,
        "seconds": seconds,
        "minutes": minutes,
        "hot": { "hits": hits, "denials": denials },
    }))
    .into_response()
}

/// A key to forget.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ResetBody {
    /// The counter key, as the rule engine builds it (the console shows it).
    key: String,
}

/// Forgets one key's count under a rule: its next check finds it new. Audited.
#[utoipa::path(
    post,
    path = "/v1/console/rules/{id}/reset",
    tag = "console",
    security(("admin_token" = [])),
    params(("id" = String, Path, description = "The rule's id.", example = "get-product")),
    request_body(content = ResetBody, example = json!({"key": "4:acme"})),
    responses(
        (status = 204, description = "Forgotten."),
        (status = 422, description = "An unknown rule or a bad key.", body = ErrorBody),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 404, description = "The console is off (no admin token), or no rule has the id named.", body = ErrorBody),
    ),
)]
async fn reset(
    State(state): State<AppState>,
    admin: Admin,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(id): Path<String>,
    axum::Json(body): axum::Json<ResetBody>,
) -> Response {
    let console = console!(state);
    let _ = admin;
    match state.service.reset_key(&id, body.key.as_bytes()).await {
        Ok(()) => {
            console.audit(Audit {
                at: console.now() / 1_000_000,
                action: "reset".into(),
                rule: id,
                key: Some(body.key),
                by: peer.ip().to_string(),
            });
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => error(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
    }
}

/// Checks a rule as the admin API would take it, changing nothing.
#[utoipa::path(
    post,
    path = "/v1/console/validate",
    tag = "console",
    security(("admin_token" = [])),
    request_body(description = "A rule, in YAML or JSON.", content_type = "application/yaml", content = String, example = "id: tight\nmatch: { path: /v1/search }\ntiers: [{ limit: 5, period: 1m }]\n"),
    responses(
        (status = 200, description = "The rule would be taken.", body = Validated),
        (status = 422, description = "What is wrong, at its line and column.", body = PlacedError),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 404, description = "The console is off (no admin token), or no rule has the id named.", body = ErrorBody),
    ),
)]
async fn validate(State(state): State<AppState>, _: Admin, body: String) -> Response {
    let _ = console!(state);
    match parse_rule_text(FilePath::new("rule"), &body) {
        Ok(spec) => {
            // As the admin API would: the rules that would result, on this store.
            match state.service.try_rule(&spec) {
                Ok(()) => axum::Json(json!({
                    "rule": spec,
                    "yaml": serde_saphyr::to_string(&spec).ok(),
                }))
                .into_response(),
                Err(message) => placed(&body, &spec.id, message),
            }
        }
        Err(e) => {
            let (line, column) = e.at.unwrap_or((1, 1));
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                axum::Json(json!({ "error": e.message, "line": line, "column": column })),
            )
                .into_response()
        }
    }
}

/// A rule's error from building it, at its field's place in `text` when it names one.
fn placed(text: &str, id: &str, message: String) -> Response {
    let (line, column) = crate::config::native::field_of_rule(text, id, &message).unwrap_or((1, 1));
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        axum::Json(json!({ "error": message, "line": line, "column": column })),
    )
        .into_response()
}

/// A proposed rule and how far back to replay.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct PreviewBody {
    /// The rule, in YAML or JSON.
    rule: String,
    /// Minutes of recorded requests to replay, 1 to 60.
    #[serde(default = "five")]
    #[schema(default = 5, minimum = 1, maximum = 60)]
    minutes: u64,
}

fn five() -> u64 {
    5
}

/// Replays the requests recorded lately through a proposed rule (and the rule of that id in
/// use): how many it would deny, which keys.
#[utoipa::path(
    post,
    path = "/v1/console/preview",
    tag = "console",
    security(("admin_token" = [])),
    request_body(content = PreviewBody, example = json!({"rule": "id: tight\nmatch: { path: /v1/search }\ntiers: [{ limit: 5, period: 1m }]\n", "minutes": 5})),
    responses(
        (status = 200, description = "What each would have done.", body = PreviewAnswer),
        (status = 422, description = "What is wrong with the rule, at its line and column.", body = PlacedError),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 404, description = "The console is off (no admin token), or no rule has the id named.", body = ErrorBody),
    ),
)]
async fn preview(
    State(state): State<AppState>,
    _: Admin,
    axum::Json(body): axum::Json<PreviewBody>,
) -> Response {
    let console = console!(state);
    let spec = match parse_rule_text(FilePath::new("rule"), &body.rule) {
        Ok(spec) => spec,
        Err(e) => {
            let (line, column) = e.at.unwrap_or((1, 1));
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                axum::Json(json!({ "error": e.message, "line": line, "column": column })),
            )
                .into_response();
        }
    };
    let since = console
        .now()
        .saturating_sub(body.minutes.clamp(1, 60) * 60_000_000);
    let recorded = console.recorded_since(since);
    let proposed = match crate::console::preview::replay(&spec, &recorded) {
        Ok(preview) => preview,
        Err(message) => return placed(&body.rule, &spec.id, message),
    };
    let current = state
        .service
        .loaded()
        .specs
        .iter()
        .find(|s| s.id == spec.id)
        .cloned();
    let current = current.and_then(|c| crate::console::preview::replay(&c, &recorded).ok());
    axum::Json(json!({ "proposed": proposed, "current": current })).into_response()
}

/// A request to match, or a rule and a key.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ExplainBody {
    /// A request, as `/v1/check` takes it.
    request: Option<ExplainRequest>,
    /// A rule, with `key`.
    rule: Option<String>,
    /// A counter key under `rule`.
    key: Option<String>,
    /// The cost to explain.
    #[serde(default = "one")]
    #[schema(default = 1)]
    cost: u64,
}

fn one() -> u64 {
    1
}

/// A request to match.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ExplainRequest {
    /// Its method.
    method: String,
    /// Its path (a query is left out).
    path: String,
    /// Its headers, by name.
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
    /// The client's address.
    #[schema(value_type = Option<String>)]
    client_ip: Option<std::net::IpAddr>,
}

/// What a check would get, and why: the rules that match, their keys and state, the
/// decision and the headers; nothing is consumed.
#[utoipa::path(
    post,
    path = "/v1/console/explain",
    tag = "console",
    security(("admin_token" = [])),
    request_body(content = ExplainBody, example = json!({"request": {"method": "GET", "path": "/v1/organizations/acme/product/7"}, "cost": 1})),
    responses(
        (status = 200, description = "The explanation.", body = Explained),
        (status = 400, description = "Neither a request nor a rule and key.", body = ErrorBody),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 404, description = "The console is off (no admin token), or no rule has the id named.", body = ErrorBody),
        (status = 422, description = "A bad key or cost.", body = ErrorBody),
    ),
)]
async fn explain(
    State(state): State<AppState>,
    _: Admin,
    axum::Json(body): axum::Json<ExplainBody>,
) -> Response {
    let _ = console!(state);
    let loaded = state.service.loaded();
    let hits: Vec<Hit> = match (&body.request, &body.rule, &body.key) {
        (Some(r), None, None) => {
            let headers: Vec<(&str, &[u8])> = r
                .headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_bytes()))
                .collect();
            let request = Request {
                method: &r.method,
                path: &r.path,
                headers: &headers[..],
                client_ip: r.client_ip,
            };
            loaded.engine.hits(&request)
        }
        (None, Some(rule), Some(key)) => match loaded.engine.rules().find(|r| r.name() == rule) {
            Some(found) => vec![Hit {
                rule: found.name(),
                key: key.as_bytes().to_vec(),
            }],
            None => return error(StatusCode::NOT_FOUND, format!("no rule `{rule}`")),
        },
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "give `request` ({method, path, headers, client_ip}), or `rule` and `key`",
            );
        }
    };
    let Some(limiter) = &loaded.limiter else {
        return axum::Json(json!({ "matches": [], "allowed": true, "headers": {} }))
            .into_response();
    };
    // A look at every key (cost 0): what each has left, consuming nothing.
    let items: Vec<Item<'_>> = hits.iter().map(|h| h.item(0)).collect();
    let decisions = if items.is_empty() {
        Vec::new()
    } else {
        match limiter.check_batch(&items).await {
            Ok(decisions) => decisions.to_vec(),
            Err(e) => return error(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
        }
    };
    let cost = body.cost;
    let would = |d: &Decision| {
        let rule = loaded.engine.rules().find(|r| r.name() == d.rule());
        rule.is_some_and(Rule::is_shadow) || (d.allowed() && d.remaining() >= cost)
    };
    let allowed = decisions.iter().all(would);
    let matches: Vec<Value> = hits
        .iter()
        .zip(&decisions)
        .map(|(hit, d)| {
            let rule = loaded.engine.rules().find(|r| r.name() == hit.rule);
            let tiers: Vec<Value> = rule
                .map(|r| {
                    r.tiers()
                        .iter()
                        .map(|t| json!({ "limit": t.limit(), "period": period(t) }))
                        .collect()
                })
                .unwrap_or_default();
            json!({
                "rule": hit.rule,
                "key": String::from_utf8_lossy(&hit.key),
                "display": crate::console::readable(&hit.key),
                "algorithm": rule.map(|r| r.algorithm().name()),
                "tiers": tiers,
                "shadow": rule.is_some_and(Rule::is_shadow),
                "binding_tier": d.tier(),
                "limit": d.limit(),
                "remaining": d.remaining(),
                "reset_after_s": d.reset_after().as_secs_f64(),
                "source": format!("{:?}", d.source()),
                "would_admit": would(d),
            })
        })
        .collect();
    let mut headers = HeaderMap::new();
    tollgate::layer::headers::add(&mut headers, &decisions);
    let headers: serde_json::Map<String, Value> = headers
        .iter()
        .map(|(n, v)| (n.to_string(), json!(v.to_str().unwrap_or_default())))
        .collect();
    axum::Json(json!({
        "matches": matches,
        "cost": cost,
        "allowed": allowed,
        "status": if allowed { 200 } else { 429 },
        "headers": headers,
    }))
    .into_response()
}

/// The admin actions taken through this instance, newest first.
#[utoipa::path(
    get,
    path = "/v1/console/audit",
    tag = "console",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The audit log.", body = AuditLog),
        (status = 401, description = "No token, or not the configured one.", body = ErrorBody),
        (status = 404, description = "The console is off (no admin token), or no rule has the id named.", body = ErrorBody),
    ),
)]
async fn audit(State(state): State<AppState>, _: Admin) -> Response {
    let console = console!(state);
    let audit: Vec<Value> = console
        .audited()
        .into_iter()
        .map(|entry| {
            let display = entry
                .key
                .as_deref()
                .map(|k| crate::console::readable(k.as_bytes()));
            let mut value = json!(entry);
            value["display"] = json!(display);
            value
        })
        .collect();
    axum::Json(json!({ "audit": audit })).into_response()
}
