//! The two checks asked on every request of a service or proxy: `POST /v1/check` (a request
//! to match, a rule and key, or Envoy descriptors, in a JSON body) and `/v1/auth` (nginx
//! `auth_request` and other proxies' forward auth), and their answers: the decisions as JSON,
//! the rate limit header fields, 429 (or the status asked for) when denied.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::extract::Query;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tollgate::engine::{Descriptor, LimitOverride, Request, descriptor};
use tollgate::layer::headers::{self, ceil_secs};
use tollgate::{Decision, Source};
use utoipa::{IntoParams, ToSchema};

use super::{AppState, bad_request};
use crate::envoy::{DescriptorOutcome, EnvoyAnswer};
use crate::service::{CheckError, Outcome, Target};

/// A check's body: one of a request to match (`request`), a rule and a key (`rule`, `key`),
/// or Envoy descriptors (`domain`, `descriptors`); and the cost. Its strings are borrowed from
/// the request's bytes where JSON escapes allow.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CheckBody<'a> {
    /// A request, checked against every rule it matches, all-or-nothing.
    #[serde(borrow)]
    request: Option<RequestBody<'a>>,
    /// A rule's id, with `key`.
    rule: Option<String>,
    /// A counter key under `rule`, up to 4 KiB.
    key: Option<String>,
    /// An Envoy domain, with `descriptors`: answered as the Envoy ratelimit service answers.
    domain: Option<String>,
    /// Envoy descriptors of `domain`.
    descriptors: Option<Vec<DescriptorBody>>,
    /// Permits to take; 0 only looks. A cost some tier can never admit is refused (400). For
    /// `/v1/report`, the cost of the work done (any, up to 2^53 - 1); for `/v1/reservations`,
    /// the estimate.
    #[serde(default = "one")]
    #[schema(default = 1)]
    cost: u64,
    /// `/v1/reservations` only: how long the reservation lives unsettled (`30s`, `5m`; at
    /// most a day), instead of its rules' own.
    #[schema(example = "2m")]
    ttl: Option<String>,
    /// A limit for the rules that take one from their caller (`caller_limit: true`), in place
    /// of their tiers, as Envoy's descriptor `limit`: each distinct limit is counted apart.
    /// Refused (403) when no rule the check applies to takes one; the other rules keep
    /// theirs, and an override of the key wins over it.
    pub(super) limit: Option<crate::config::TierSpec>,
}

/// A request to match against the rules.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RequestBody<'a> {
    /// Its method.
    #[serde(borrow)]
    #[schema(value_type = String)]
    method: Cow<'a, str>,
    /// Its path; a query after `?` is left out.
    #[serde(borrow)]
    #[schema(value_type = String)]
    path: Cow<'a, str>,
    /// Its headers, by name (any case).
    #[serde(default, borrow, deserialize_with = "pairs")]
    #[schema(value_type = std::collections::BTreeMap<String, String>)]
    headers: Headers<'a>,
    /// The client's address, for rules keyed on `client_ip`.
    #[schema(value_type = Option<String>)]
    client_ip: Option<IpAddr>,
}

/// Header (name, value) pairs, borrowed from the body where they have no escapes.
#[derive(Debug, Default)]
pub(super) struct Headers<'a>(Vec<(Cow<'a, str>, Cow<'a, str>)>);

impl tollgate::engine::Headers for Headers<'_> {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_bytes())
    }

    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) {
        for (name, value) in &self.0 {
            f(name, value.as_bytes());
        }
    }
}

/// A JSON object of strings as (name, value) pairs, borrowed where they have no escapes.
fn pairs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Headers<'de>, D::Error> {
    struct Text<'a>(Cow<'a, str>);
    impl<'de> Deserialize<'de> for Text<'de> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Text<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a string")
                }
                fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'de>, E> {
                    Ok(Text(Cow::Borrowed(v)))
                }
                fn visit_str<E>(self, v: &str) -> Result<Text<'de>, E> {
                    Ok(Text(Cow::Owned(v.to_string())))
                }
            }
            d.deserialize_str(V)
        }
    }
    struct Pairs;
    impl<'de> serde::de::Visitor<'de> for Pairs {
        type Value = Headers<'de>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object of header names to values")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(4));
            while let Some((Text(k), Text(v))) = map.next_entry::<Text<'de>, Text<'de>>()? {
                pairs.push((k, v));
            }
            Ok(Headers(pairs))
        }
    }
    d.deserialize_map(Pairs)
}

/// An Envoy descriptor: its entries, in order, and its own cost.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct DescriptorBody {
    /// The entries.
    entries: Vec<EntryBody>,
    /// Its hits, instead of the body's `cost`.
    cost: Option<u64>,
}

/// One entry of a descriptor.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct EntryBody {
    /// The entry's key.
    key: String,
    /// Its value.
    value: String,
}

fn one() -> u64 {
    1
}

/// The check API's answer, written by hand into one buffer (it runs on every check):
/// `{"allowed": bool, "decisions": [{"rule", "allowed", "limit", "remaining",
/// "reset_after_ms", "retry_after_ms" (when denied), "window_s", "shadowed", "source"}],
/// "region" (when a global rule decided)}`.
/// Rule names are letters, digits and `_ - . : /`, so they need no escaping.
pub(super) fn answer_json(allowed: bool, decisions: &[Decision]) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + 200 * decisions.len());
    let number = |out: &mut Vec<u8>, name: &str, n: u64| {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    };
    let flag = |b: bool| if b { "true" } else { "false" };
    out.extend_from_slice(b"{\"allowed\":");
    out.extend_from_slice(flag(allowed).as_bytes());
    out.extend_from_slice(b",\"decisions\":[");
    for (i, d) in decisions.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"rule\":\"");
        out.extend_from_slice(d.rule().as_bytes());
        out.extend_from_slice(b"\",\"allowed\":");
        out.extend_from_slice(flag(d.allowed()).as_bytes());
        number(&mut out, ",\"limit\":", d.limit());
        number(&mut out, ",\"remaining\":", d.remaining());
        number(&mut out, ",\"reset_after_ms\":", millis(d.reset_after()));
        if let Some(retry) = d.retry_after() {
            number(&mut out, ",\"retry_after_ms\":", millis(retry));
        }
        number(&mut out, ",\"window_s\":", ceil_secs(d.window()));
        out.extend_from_slice(b",\"shadowed\":");
        out.extend_from_slice(flag(d.shadowed()).as_bytes());
        out.extend_from_slice(b",\"source\":\"");
        out.extend_from_slice(source_name(d.source()).as_bytes());
        out.extend_from_slice(b"\"}");
    }
    out.extend_from_slice(b"]");
    if let Some(region) = crate::service::REGION.get()
        && decisions
            .iter()
            .any(|d| matches!(d.source(), Source::Global | Source::Partitioned))
    {
        // Region names are letters, digits, - and _: no escaping either.
        out.extend_from_slice(b",\"region\":\"");
        out.extend_from_slice(region.as_bytes());
        out.push(b'"');
    }
    out.push(b'}');
    out
}

fn millis(d: std::time::Duration) -> u64 {
    d.as_micros().div_ceil(1_000) as u64
}

/// The name of the path that decided, as the API reports it.
fn source_name(source: Source) -> &'static str {
    match source {
        Source::Memory => "memory",
        Source::Redis => "redis",
        Source::RedisModule => "redis_module",
        Source::Hybrid => "hybrid",
        Source::Lease => "lease",
        Source::Global => "global",
        Source::Partitioned => "partitioned",
        Source::Fallback => "fallback",
        Source::FailOpen => "fail_open",
        Source::FailClosed => "fail_closed",
        Source::Listed => "list",
        Source::Cache => "cache",
        _ => "other",
    }
}

/// Checks a request (or a rule and key, or Envoy descriptors), consuming `cost` permits from
/// every rule that applies, or from none.
#[utoipa::path(
    post,
    path = "/v1/check",
    tag = "checks",
    request_body(
        content = CheckBody,
        examples(
            ("request" = (summary = "A request to match", value = json!({"request": {"method": "GET", "path": "/v1/organizations/acme/product/7", "headers": {"x-tenant": "acme"}, "client_ip": "10.0.0.1"}, "cost": 1}))),
            ("rule and key" = (summary = "A key under one rule", value = json!({"rule": "get-product", "key": "acme", "cost": 1}))),
            ("descriptors" = (summary = "Envoy descriptors", value = json!({"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.1"}]}]}))),
            ("a stated limit" = (summary = "A tenant's limit, from the proxy's auth, for a rule with `caller_limit: true`", value = json!({"rule": "tokens", "key": "acme", "cost": 1, "limit": {"limit": 50000, "period": "1h"}}))),
        ),
    ),
    responses(
        (status = 200, description = "Admitted: every rule admits, and each consumed the cost.", body = super::answers::CheckAnswer, headers(
            ("X-RateLimit-Limit" = u64, description = "The binding tier's capacity."),
            ("X-RateLimit-Remaining" = u64, description = "What the binding tier would still admit now."),
            ("X-RateLimit-Reset" = u64, description = "Seconds, rounded up, until the binding tier is full again."),
            ("RateLimit-Policy" = String, description = "Every tier of every rule that decided: `\"name\";q=QUOTA;w=SECONDS`."),
            ("RateLimit" = String, description = "The binding tier's policy, what it would still admit and the seconds to wait or until full: `\"name\";r=0;t=1`."),
            ("Tollgate-Permit" = String, description = "When a concurrency rule admitted: the permit its slots are held under (also `permit` in the body)."),
        )),
        (status = 429, description = "Denied: some rule denies; nothing was consumed. `Retry-After` says when the same request would be admitted.", body = super::answers::CheckAnswer, example = json!({"allowed": false, "decisions": [{"rule": "get-product", "allowed": false, "limit": 1000, "remaining": 0, "reset_after_ms": 4210, "retry_after_ms": 4210, "window_s": 10, "shadowed": false, "source": "memory"}]})),
        (status = 400, description = "A body that is not a check: an unknown rule, a bad key, a cost no tier can admit, a stated limit the rule's algorithm cannot take, not UTF-8.", body = super::answers::ErrorBody),
        (status = 403, description = "A `limit` stated, and no rule the check applies to takes one (`caller_limit: true`): nothing counted. Also a key on a deny list whose entry answers 403: then the body is a check's answer (decisions of source `list`), nothing counted.", body = super::answers::Forbidden),
        (status = 413, description = "A body over `server.max_body_bytes`.", body = super::answers::ErrorBody),
        (status = 415, description = "Not `application/json`.", body = super::answers::ErrorBody),
        (status = 422, description = "JSON of the wrong shape (an unknown field, a negative cost).", body = super::answers::ErrorBody),
    ),
)]
pub(super) async fn check(state: AppState, request: axum::extract::Request) -> Response {
    let bytes = match json_body(&state, request).await {
        Ok(bytes) => bytes,
        Err(refused) => return refused,
    };
    let body = match parsed(&bytes) {
        Ok(body) => body,
        Err(refused) => return refused.into_response(),
    };
    if body.ttl.is_some() {
        return bad_request(StatusCode::BAD_REQUEST, "`ttl` is for /v1/reservations");
    }
    let cost = body.cost;
    match (&body.request, &body.rule, &body.domain) {
        (Some(r), None, None) if body.key.is_none() && body.descriptors.is_none() => {
            let path = r.path.split('?').next().unwrap_or_default();
            let request = Request {
                method: &r.method,
                path,
                headers: &r.headers,
                client_ip: client(&state, r.client_ip, &r.headers),
            };
            let limit = body.limit.as_ref();
            let outcome = state.service.check_request(&request, cost, limit).await;
            answer_outcome(outcome, StatusCode::TOO_MANY_REQUESTS, true)
        }
        (None, Some(rule), None) if body.descriptors.is_none() => {
            let Some(key) = &body.key else {
                return bad_request(StatusCode::BAD_REQUEST, "`rule` needs a `key`");
            };
            let limit = body.limit.as_ref();
            let outcome = state
                .service
                .check_key(rule, key.as_bytes(), cost, limit)
                .await;
            answer_outcome(outcome, StatusCode::TOO_MANY_REQUESTS, true)
        }
        (None, None, Some(_)) if body.limit.is_some() => bad_request(
            StatusCode::BAD_REQUEST,
            "Envoy descriptors state their limits in their own `limit` (over gRPC)",
        ),
        (None, None, Some(domain)) if body.key.is_none() => {
            let Some(descriptors) = &body.descriptors else {
                return bad_request(StatusCode::BAD_REQUEST, "`domain` needs `descriptors`");
            };
            let list: Vec<(Descriptor, u64, Option<LimitOverride>)> = descriptors
                .iter()
                .map(|d| {
                    let entries = descriptor(d.entries.iter().map(|e| (&*e.key, &*e.value)));
                    (entries, d.cost.unwrap_or(cost), None)
                })
                .collect();
            match state.envoy.check_descriptors(domain, &list).await {
                Ok(answer) => answer_descriptors(&answer),
                Err(e) => refused(e),
            }
        }
        _ => bad_request(
            StatusCode::BAD_REQUEST,
            "give one of: `request`; `rule` and `key`; `domain` and `descriptors`",
        ),
    }
}

/// The client of a checked request whose address is `given`: behind a trusted proxy
/// (`server.trusted_proxies`), the one its `X-Forwarded-For` names.
fn client(state: &AppState, given: Option<IpAddr>, headers: &Headers<'_>) -> Option<IpAddr> {
    let trusted = &state.service.loaded().config.server.trusted_proxies;
    given.map(|ip| client_behind_given(trusted, ip, headers))
}

/// `ip`, or the client behind it when it is one of `trusted`.
fn client_behind_given(
    trusted: &[tollgate::engine::IpRange],
    ip: IpAddr,
    headers: &Headers<'_>,
) -> IpAddr {
    if trusted.is_empty() {
        return ip;
    }
    let forwarded = headers
        .0
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("x-forwarded-for"))
        .map(|(_, value)| value.as_ref());
    tollgate::engine::client_behind(ip, forwarded, trusted)
}

/// The body of a JSON request, within `max_body_bytes` and UTF-8; or the 4xx that says why
/// not.
pub(super) async fn json_body(
    state: &AppState,
    request: axum::extract::Request,
) -> Result<axum::body::Bytes, Response> {
    let json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json {
        return Err(bad_request(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "expected a body of content-type application/json",
        ));
    }
    axum::body::to_bytes(request.into_body(), state.max_body_bytes)
        .await
        .map_err(|e| {
            let over = std::error::Error::source(&e)
                .is_some_and(|e| e.is::<http_body_util::LengthLimitError>());
            match over {
                true => bad_request(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the body is over {} bytes", state.max_body_bytes),
                ),
                false => bad_request(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the body: {e}"),
                ),
            }
        })
}

/// A 4xx to answer: its status and what is wrong.
#[derive(Debug)]
pub(super) struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        bad_request(self.0, self.1)
    }
}

/// A check's body from `bytes`; or the 4xx that says what is wrong.
pub(super) fn parsed(bytes: &[u8]) -> Result<CheckBody<'_>, Refusal> {
    // Checked once here: parsing from a `str` spares serde_json checking each string again.
    let text = std::str::from_utf8(bytes).map_err(|e| {
        Refusal(
            StatusCode::BAD_REQUEST,
            format!("the body is not UTF-8: {e}"),
        )
    })?;
    serde_json::from_str(text).map_err(|e| {
        let status = match e.classify() {
            serde_json::error::Category::Data => StatusCode::UNPROCESSABLE_ENTITY,
            _ => StatusCode::BAD_REQUEST,
        };
        Refusal(status, format!("invalid body: {e}"))
    })
}

/// What metered work (`/v1/report`, `/v1/reservations`) is asked of, from a check's body: a
/// request, or a rule and a key. Descriptors are refused: Envoy's `hits_addend` reports them.
pub(super) enum Asked<'a> {
    /// A request to match.
    Request(Request<'a, Headers<'a>>),
    /// A key under a rule.
    Key(&'a str, &'a [u8]),
}

impl<'a> Asked<'a> {
    /// What `body` asks, its cost and its `ttl`; or the 4xx that says what is wrong.
    /// (A request's client behind one of the `trusted` proxies is the one they name.)
    pub(super) fn of(
        body: &'a CheckBody<'a>,
        trusted: &[tollgate::engine::IpRange],
    ) -> Result<(Self, u64, Option<std::time::Duration>), Refusal> {
        let bad = |message: String| Refusal(StatusCode::BAD_REQUEST, message);
        let ttl = match &body.ttl {
            Some(ttl) => {
                Some(crate::config::parse_duration(ttl).map_err(|e| bad(format!("ttl: {e}")))?)
            }
            None => None,
        };
        if body.domain.is_some() || body.descriptors.is_some() {
            return Err(bad(
                "Envoy descriptors report their hits through the gRPC service's hits_addend; \
                 give `request`, or `rule` and `key`"
                    .into(),
            ));
        }
        let asked = match (&body.request, &body.rule, &body.key) {
            (Some(r), None, None) => Self::Request(Request {
                method: &r.method,
                path: r.path.split('?').next().unwrap_or_default(),
                headers: &r.headers,
                client_ip: r
                    .client_ip
                    .map(|ip| client_behind_given(trusted, ip, &r.headers)),
            }),
            (None, Some(rule), Some(key)) => Self::Key(rule, key.as_bytes()),
            _ => return Err(bad("give one of: `request`; `rule` and `key`".into())),
        };
        Ok((asked, body.cost, ttl))
    }

    /// As the service takes it.
    pub(super) fn target(&'a self) -> Target<'a, Headers<'a>> {
        match self {
            Self::Request(request) => Target::Request(request),
            Self::Key(rule, key) => Target::Key { rule, key },
        }
    }
}

/// The answer to a check: the decisions as JSON when `json`, the headers, and `denied` as the
/// status when the request is not admitted.
fn answer_outcome(
    outcome: Result<Outcome, CheckError>,
    denied: StatusCode,
    json: bool,
) -> Response {
    if let Ok(outcome) = &outcome {
        crate::telemetry::record(&outcome.decisions);
    }
    match outcome {
        Ok(Outcome {
            decisions,
            forbidden: true,
            ..
        }) => answer(&decisions, StatusCode::FORBIDDEN, json),
        Ok(Outcome {
            decisions,
            permit: None,
            ..
        }) => answer(&decisions, denied, json),
        Ok(Outcome {
            decisions,
            permit: Some(permit),
            ..
        }) => {
            // A permit is held only when admitted. In JSON it goes ahead of the answer's fields
            // (ids are hex digits, nothing to escape).
            let before = format!(
                "\"permit\":\"{}\",\"permit_expires_in_ms\":{},",
                permit.id,
                permit.expires_in.as_millis()
            );
            let mut response = match json {
                true => outcome_answer(&Outcome::of(decisions), StatusCode::OK, &before),
                false => answer(&decisions, denied, false),
            };
            let id = HeaderValue::from_str(&permit.id).expect("a permit id is hex digits");
            response.headers_mut().insert(PERMIT, id);
            response
        }
        Err(e) => refused(e),
    }
}

/// The header field that carries the permit of slots held (concurrency rules), for callers
/// that read no body (`/v1/auth`).
const PERMIT: HeaderName = HeaderName::from_static("tollgate-permit");

/// The answer to what the service refused: 400 for the caller's mistake, 403 for what the
/// rules do not let a caller do, 404 for an unknown reservation, 503 for what the store could
/// not take now, 501 for what it never does.
pub(super) fn refused(e: CheckError) -> Response {
    let status = match &e {
        CheckError::Invalid(_) => StatusCode::BAD_REQUEST,
        CheckError::UnknownReservation(_) => StatusCode::NOT_FOUND,
        CheckError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        CheckError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        CheckError::Forbidden(_) => StatusCode::FORBIDDEN,
    };
    bad_request(status, e.to_string())
}

/// The answer to `decisions`, all-or-nothing: see [`answer_outcome`].
fn answer(decisions: &[Decision], denied: StatusCode, json: bool) -> Response {
    answer_as(
        decisions.iter().all(Decision::allowed),
        decisions,
        denied,
        json,
    )
}

/// The answer to `decisions` when the request is `allowed` or not.
fn answer_as(allowed: bool, decisions: &[Decision], denied: StatusCode, json: bool) -> Response {
    let status = match (allowed, json) {
        (true, true) => StatusCode::OK,
        (true, false) => StatusCode::NO_CONTENT,
        (false, _) => denied,
    };
    // Room for the content type and every rate limit field, so that the map never grows.
    let mut fields = HeaderMap::with_capacity(8);
    let body = if json {
        let json = HeaderValue::from_static("application/json");
        fields.insert(header::CONTENT_TYPE, json);
        Body::from(answer_json(allowed, decisions))
    } else {
        Body::empty()
    };
    headers::add(&mut fields, decisions);
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = fields;
    response
}

/// The answer to Envoy descriptors: denied when the Envoy service would answer over the
/// limit (see [`DescriptorOutcome::overall_over`]).
fn answer_descriptors(answer: &EnvoyAnswer) -> Response {
    let decisions = DescriptorOutcome::decisions(&answer.outcomes);
    answer_as(
        !answer.over,
        &decisions,
        StatusCode::TOO_MANY_REQUESTS,
        true,
    )
}

/// `/v1/auth`'s query.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct AuthQuery {
    /// The status of a denial: 429 (the default), or 401 or 403 for proxies that pass only
    /// those on (nginx's `auth_request`).
    deny_status: Option<u16>,
    /// Permits to take (1).
    cost: Option<u64>,
}

// The original request's fields, named ahead: a name given as text is parsed on every lookup.
const X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");
const X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");
const X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
const X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// nginx `auth_request` and other proxies' forward auth (any method): checks the original
/// request its headers describe, and answers with no body.
#[utoipa::path(
    get,
    path = "/v1/auth",
    tag = "checks",
    params(
        AuthQuery,
        ("X-Original-URI" = String, Header, description = "The original request's URI (or `X-Forwarded-Uri`).", example = "/v1/organizations/acme/product/7"),
        ("X-Original-Method" = Option<String>, Header, description = "Its method (or `X-Forwarded-Method`); GET when absent."),
        ("X-Real-IP" = Option<String>, Header, description = "The client's address; the connection's when absent."),
    ),
    responses(
        (status = 204, description = "Admitted.", headers(
            ("X-RateLimit-Limit" = u64, description = "The binding tier's capacity."),
            ("X-RateLimit-Remaining" = u64, description = "What the binding tier would still admit now."),
            ("X-RateLimit-Reset" = u64, description = "Seconds, rounded up, until the binding tier is full again."),
            ("RateLimit-Policy" = String, description = "Every tier of every rule that decided: `\"name\";q=QUOTA;w=SECONDS`."),
            ("RateLimit" = String, description = "The binding tier's policy, what it would still admit and the seconds to wait or until full: `\"name\";r=0;t=1`."),
            ("Tollgate-Permit" = String, description = "When a concurrency rule admitted: the permit its slots are held under, to release with `POST /v1/release`."),
        )),
        (status = 429, description = "Denied (or the `deny_status` asked for: 401, 403); `Retry-After` says when."),
        (status = 400, description = "No `X-Original-URI`, or a bad `deny_status` or cost.", body = super::answers::ErrorBody),
    ),
)]
pub(super) async fn auth(
    state: AppState,
    peer: SocketAddr,
    request: axum::extract::Request,
) -> Response {
    let query: AuthQuery = match Query::try_from_uri(request.uri()) {
        Ok(Query(query)) => query,
        Err(rejection) => return rejection.into_response(),
    };
    let headers = request.headers();
    let denied = match query.deny_status {
        None | Some(429) => StatusCode::TOO_MANY_REQUESTS,
        Some(401) => StatusCode::UNAUTHORIZED,
        Some(403) => StatusCode::FORBIDDEN,
        Some(other) => {
            return bad_request(
                StatusCode::BAD_REQUEST,
                format!("deny_status {other}: expected 401, 403 or 429"),
            );
        }
    };
    let text = |names: &[HeaderName]| {
        names
            .iter()
            .find_map(|n| headers.get(n).and_then(|v| v.to_str().ok()))
    };
    let Some(uri) = text(&[X_ORIGINAL_URI, X_FORWARDED_URI]) else {
        return bad_request(
            StatusCode::BAD_REQUEST,
            "missing X-Original-URI (nginx: proxy_set_header X-Original-URI $request_uri)",
        );
    };
    let method = text(&[X_ORIGINAL_METHOD, X_FORWARDED_METHOD]).unwrap_or("GET");
    let given = text(&[X_REAL_IP])
        .and_then(|ip| ip.trim().parse().ok())
        .unwrap_or(peer.ip());
    let forwarded = headers
        .get_all(header::HeaderName::from_static("x-forwarded-for"))
        .iter()
        .filter_map(|v| v.to_str().ok());
    let client_ip = {
        let loaded = state.service.loaded();
        tollgate::engine::client_behind(given, forwarded, &loaded.config.server.trusted_proxies)
    };
    let path = uri.split('?').next().unwrap_or_default();
    let request = Request {
        method,
        path,
        headers,
        client_ip: Some(client_ip),
    };
    let outcome = state
        .service
        .check_request(&request, query.cost.unwrap_or(1), None)
        .await;
    answer_outcome(outcome, denied, false)
}

/// `outcome` as JSON (`before` written ahead of its fields), with the rate limit fields and
/// `status`.
pub(super) fn outcome_answer(outcome: &Outcome, status: StatusCode, before: &str) -> Response {
    let json = answer_json(outcome.allowed(), &outcome.decisions);
    let mut body = Vec::with_capacity(json.len() + before.len());
    body.push(b'{');
    body.extend_from_slice(before.as_bytes());
    body.extend_from_slice(&json[1..]);
    let mut fields = HeaderMap::with_capacity(8);
    fields.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    tollgate::layer::headers::add(&mut fields, &outcome.decisions);
    (status, fields, body).into_response()
}
