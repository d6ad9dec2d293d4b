//! Envoy's rate limit service over gRPC: `envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit`, answered as the Envoy ratelimit service answers it: each descriptor
//! counts its hits whatever the others' outcome (see [`Envoy::check_descriptors`]), a
//! descriptor may carry its own limit, and the statuses report what that service reports.
//! Each descriptor's cost is its `hits_addend`, else the request's, else 1; a descriptor
//! sent with `is_negative_hits` gives that many back instead (see [`Envoy::give_back`]). A
//! message is at most `server.grpc_max_message_bytes` long and carries at most 1,024
//! descriptors and 16,384 entries, counted before it is decoded ([`super::wire`]). When
//! asked, answers carry the rate limit fields of the HTTP answers in
//! `response_headers_to_add`, which Envoy adds to its answer to the client.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, ListValue, Struct, Value};
use std::collections::HashMap;
use tollgate::engine::{Descriptor, LimitOverride, NodeLimit, descriptor};
use tollgate::{Decision, Source};
use tonic::{Request, Response, Status};

use super::answer::{DescriptorOutcome, Envoy};
use super::wire::Bounded;
use crate::service::CheckError;

/// The gRPC service over `envoy`; with `response_headers`, answers carry the rate limit
/// fields for Envoy to add to its answer. A request message longer than `max_message` bytes,
/// or with too many descriptors or entries, is refused before it is decoded (`OUT_OF_RANGE`):
/// see [`super::wire`].
pub fn server(
    envoy: Arc<Envoy>,
    response_headers: bool,
    max_message: usize,
) -> Bounded<RateLimitServiceServer<Rls>> {
    Bounded(
        RateLimitServiceServer::new(Rls {
            envoy,
            response_headers,
            calls: crate::metrics::CallStats::default(),
        })
        .max_decoding_message_size(max_message),
    )
}

/// Answers `ShouldRateLimit` from the service's domains.
#[derive(Debug)]
pub struct Rls {
    envoy: Arc<Envoy>,
    response_headers: bool,
    calls: crate::metrics::CallStats,
}

fn unit(limit: &NodeLimit) -> Unit {
    match limit.unit.0.as_str() {
        "second" => Unit::Second,
        "minute" => Unit::Minute,
        "hour" => Unit::Hour,
        "day" => Unit::Day,
        "week" => Unit::Week,
        "month" => Unit::Month,
        "year" => Unit::Year,
        _ => Unit::Unknown,
    }
}

/// The name of a unit a descriptor's own limit gives; `None` for an unknown unit.
fn unit_name(unit: Unit) -> Option<&'static str> {
    Some(match unit {
        Unit::Second => "second",
        Unit::Minute => "minute",
        Unit::Hour => "hour",
        Unit::Day => "day",
        Unit::Week => "week",
        Unit::Month => "month",
        Unit::Year => "year",
        Unit::Unknown => return None,
    })
}

/// The limit as the answer names it: its configured name (empty when it has none), its
/// permits per unit and its unit.
fn current_limit(limit: &NodeLimit) -> RateLimit {
    RateLimit {
        name: limit.name.clone().unwrap_or_default(),
        requests_per_unit: u32::try_from(limit.requests_per_unit).unwrap_or(u32::MAX),
        unit: unit(limit) as i32,
    }
}

/// One descriptor's status, as the Envoy ratelimit service gives it: no limit is OK with
/// nothing remaining, `unlimited` OK with all (2^32 - 1); a limit says its remaining permits
/// (0 when over) and the whole seconds until its window resets.
fn status(outcome: &DescriptorOutcome) -> DescriptorStatus {
    let code = |over: bool| if over { Code::OverLimit } else { Code::Ok } as i32;
    match outcome {
        DescriptorOutcome::None => DescriptorStatus {
            code: Code::Ok as i32,
            ..DescriptorStatus::default()
        },
        DescriptorOutcome::Unlimited => DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: u32::MAX,
            ..DescriptorStatus::default()
        },
        DescriptorOutcome::Blocked { limit, reset_after } => DescriptorStatus {
            code: code(outcome.over()),
            current_limit: Some(current_limit(limit)),
            duration_until_reset: Some(whole_seconds(*reset_after)),
            ..DescriptorStatus::default()
        },
        DescriptorOutcome::Checked {
            limit,
            decision,
            remaining,
            ..
        } => DescriptorStatus {
            code: code(outcome.over()),
            current_limit: Some(current_limit(limit)),
            limit_remaining: u32::try_from(*remaining).unwrap_or(u32::MAX),
            duration_until_reset: Some(whole_seconds(decision.reset_after())),
            ..DescriptorStatus::default()
        },
    }
}

/// The rate limit fields an HTTP answer to `decisions` carries, as Envoy headers.
fn response_headers(decisions: &[Decision]) -> Vec<HeaderValue> {
    let mut fields = axum::http::HeaderMap::new();
    tollgate::layer::headers::add(&mut fields, decisions);
    fields
        .iter()
        .map(|(name, value)| HeaderValue {
            key: name.as_str().to_owned(),
            // The fields are ASCII: digits, and rule names that can stand in a field.
            value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
            ..HeaderValue::default()
        })
        .collect()
}

/// `d` rounded up to whole seconds, as the Envoy service reports how long until a reset.
fn whole_seconds(d: std::time::Duration) -> ProtoDuration {
    let seconds = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    ProtoDuration {
        seconds: i64::try_from(seconds).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        use crate::metrics::CallEnd;
        let started = std::time::Instant::now();
        let store = self.envoy.service().store().kind();
        let span =
            crate::telemetry::check_span("ShouldRateLimit", request.metadata().as_ref(), store);
        let request = request.into_inner();
        // Inline, not through a function taking the future: each layer of future moved costs
        // a copy of it on every call.
        let answered = if span.is_none() {
            answered(&self.envoy, request, self.response_headers).await
        } else {
            crate::telemetry::record_domain(&span, &request.domain);
            let answering = answered(&self.envoy, request, self.response_headers);
            tracing::Instrument::instrument(answering, span).await
        };
        let end = match &answered {
            Err(_) => CallEnd::ServiceError,
            Ok((_, true)) => CallEnd::RedisError,
            Ok((_, false)) => CallEnd::Answered,
        };
        self.calls.record(started.elapsed(), end);
        answered.map(|(response, _)| Response::new(response))
    }
}

/// Answers `request` as the Envoy ratelimit service does (`POST /json` answers the same);
/// with `fields`, the answer also carries tollgate's rate limit fields for Envoy to add.
///
/// # Errors
/// `INVALID_ARGUMENT` for a request without a domain or descriptors, or a bad key.
pub async fn answer(
    envoy: &Envoy,
    request: RateLimitRequest,
    fields: bool,
) -> Result<RateLimitResponse, Status> {
    answered(envoy, request, fields)
        .await
        .map(|(response, _)| response)
}

/// As [`answer`], with whether the store failed and a failure policy decided a descriptor.
async fn answered(
    envoy: &Envoy,
    request: RateLimitRequest,
    fields: bool,
) -> Result<(RateLimitResponse, bool), Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit domain must not be empty",
        ));
    }
    if request.descriptors.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit descriptor list must not be empty",
        ));
    }
    let default_cost = u64::from(request.hits_addend.max(1));
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let entries = descriptor(d.entries.iter().map(|e| (&*e.key, &*e.value)));
            let cost = d.hits_addend.as_ref().map_or(default_cost, |h| h.value);
            // A limit of no known unit is refused: applying none would stop limiting.
            let limit = match &d.limit {
                None => None,
                Some(l) => Some(LimitOverride {
                    requests_per_unit: u64::from(l.requests_per_unit),
                    unit: Unit::try_from(l.unit)
                        .ok()
                        .and_then(unit_name)
                        .ok_or_else(|| {
                            Status::invalid_argument(format!(
                                "a descriptor's limit has no known unit ({})",
                                l.unit
                            ))
                        })?,
                }),
            };
            Ok((entries, cost, limit))
        })
        .collect::<Result<Vec<(Descriptor, u64, Option<LimitOverride>)>, Status>>()?;
    let refused = |e: CheckError| match e {
        CheckError::Invalid(message) => Status::invalid_argument(message),
        other => Status::unavailable(other.to_string()),
    };
    // Negative hits (a stream done) give back; the others are checked, as if alone.
    let negative: Vec<bool> = request
        .descriptors
        .iter()
        .map(|d| d.is_negative_hits)
        .collect();
    let answer = if negative.contains(&true) {
        let (given, checked): (Vec<_>, Vec<_>) = descriptors
            .into_iter()
            .zip(&negative)
            .partition(|(_, negative)| **negative);
        let given: Vec<_> = given.into_iter().map(|(d, _)| d).collect();
        let checked: Vec<_> = checked.into_iter().map(|(d, _)| d).collect();
        let mut answer = envoy
            .check_descriptors(&request.domain, &checked)
            .await
            .map_err(refused)?;
        let given = envoy
            .give_back(&request.domain, &given)
            .await
            .map_err(refused)?;
        let (mut given, mut checked) = (given.into_iter(), answer.outcomes.into_iter());
        answer.outcomes = negative
            .iter()
            .filter_map(|negative| match negative {
                true => given.next(),
                false => checked.next(),
            })
            .collect();
        answer
    } else {
        envoy
            .check_descriptors(&request.domain, &descriptors)
            .await
            .map_err(refused)?
    };
    crate::telemetry::record(&DescriptorOutcome::decisions(&answer.outcomes));
    let statuses: Vec<DescriptorStatus> = answer.outcomes.iter().map(status).collect();
    let overall = if answer.over {
        Code::OverLimit
    } else {
        Code::Ok
    };
    let response_headers_to_add = match &answer.response_headers {
        Some(names) => envoy_headers(names, &answer.outcomes, &statuses),
        None if fields => response_headers(&DescriptorOutcome::decisions(&answer.outcomes)),
        None => Vec::new(),
    };
    let dynamic_metadata = answer
        .dynamic_metadata
        .then(|| metadata(&request, &answer.outcomes, &statuses));
    let store_failed = DescriptorOutcome::decisions(&answer.outcomes)
        .iter()
        .any(|d| {
            matches!(
                d.source(),
                Source::FailOpen | Source::FailClosed | Source::Fallback
            )
        });
    let response = RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        response_headers_to_add,
        dynamic_metadata,
        ..RateLimitResponse::default()
    };
    Ok((response, store_failed))
}

/// The dynamic metadata the Envoy service answers with `RESPONSE_DYNAMIC_METADATA`: the
/// domain, each descriptor (its entries as `key=value`, its own limit, its hits) and the
/// request's hits, and the `metadata` of every limit that passed, merged (a key met twice
/// keeps its first value, unless both are maps, which merge).
fn metadata(
    request: &RateLimitRequest,
    outcomes: &[DescriptorOutcome],
    statuses: &[DescriptorStatus],
) -> Struct {
    let mut fields = HashMap::new();
    fields.insert("domain".to_string(), string(&request.domain));
    let descriptors = request
        .descriptors
        .iter()
        .map(|d| {
            let mut fields = HashMap::new();
            let entries = d
                .entries
                .iter()
                .map(|e| string(&format!("{}={}", e.key, e.value)))
                .collect();
            fields.insert("entries".to_string(), list(entries));
            if let Some(limit) = &d.limit {
                let unit = Unit::try_from(limit.unit).unwrap_or(Unit::Unknown);
                let text = format!(
                    "requests_per_unit:{} unit:{}",
                    limit.requests_per_unit,
                    unit.as_str_name()
                );
                fields.insert("limit".to_string(), string(&text));
            }
            if let Some(hits) = &d.hits_addend {
                fields.insert("hitsAddend".to_string(), number(hits.value as f64));
            }
            structure(Struct { fields })
        })
        .collect();
    fields.insert("descriptors".to_string(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert(
            "hitsAddend".to_string(),
            number(f64::from(request.hits_addend)),
        );
    }
    let mut passed = Struct::default();
    for (outcome, status) in outcomes.iter().zip(statuses) {
        let limit = match outcome {
            DescriptorOutcome::Checked { limit, .. } | DescriptorOutcome::Blocked { limit, .. } => {
                limit
            }
            DescriptorOutcome::None | DescriptorOutcome::Unlimited => continue,
        };
        if status.code == Code::OverLimit as i32 {
            continue;
        }
        if let Some(json) = &limit.metadata
            && let Ok(serde_json::Value::Object(map)) = serde_json::from_str(json)
        {
            merge(&mut passed, from_json_map(map));
        }
    }
    if !passed.fields.is_empty() {
        fields.insert("metadata".to_string(), structure(passed));
    }
    Struct { fields }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn structure(s: Struct) -> Value {
    Value {
        kind: Some(Kind::StructValue(s)),
    }
}

fn from_json_map(map: serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: map.into_iter().map(|(k, v)| (k, from_json(v))).collect(),
    }
}

fn from_json(value: serde_json::Value) -> Value {
    use serde_json::Value as J;
    let kind = match value {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s),
        J::Array(items) => Kind::ListValue(ListValue {
            values: items.into_iter().map(from_json).collect(),
        }),
        J::Object(map) => Kind::StructValue(from_json_map(map)),
    };
    Value { kind: Some(kind) }
}

/// Merges `from` into `into`: keys `into` lacks are added; maps under one key merge.
fn merge(into: &mut Struct, from: Struct) {
    for (key, value) in from.fields {
        match (into.fields.get_mut(&key), value) {
            (None, value) => {
                into.fields.insert(key, value);
            }
            (
                Some(Value {
                    kind: Some(Kind::StructValue(old)),
                }),
                Value {
                    kind: Some(Kind::StructValue(new)),
                },
            ) => merge(old, new),
            (Some(_), _) => {}
        }
    }
}

/// The three headers the Envoy service asks Envoy to add with `LIMIT_RESPONSE_HEADERS_ENABLED`
/// (named `names`): of the descriptor with a limit and the fewest permits left, or of the
/// last one over its limit outside quota mode, its limit, what remains and the whole seconds
/// until its window resets.
fn envoy_headers(
    names: &[String; 3],
    outcomes: &[DescriptorOutcome],
    statuses: &[DescriptorStatus],
) -> Vec<HeaderValue> {
    let mut chosen: Option<&DescriptorStatus> = None;
    let mut least = u32::MAX;
    for (outcome, status) in outcomes.iter().zip(statuses) {
        if status.current_limit.is_some() && status.limit_remaining < least {
            chosen = Some(status);
            least = status.limit_remaining;
        }
        let quota = match outcome {
            DescriptorOutcome::Blocked { limit, .. } | DescriptorOutcome::Checked { limit, .. } => {
                limit.quota
            }
            DescriptorOutcome::None | DescriptorOutcome::Unlimited => false,
        };
        if status.code == Code::OverLimit as i32 && !quota {
            chosen = Some(status);
            least = 0;
        }
    }
    let Some(status) = chosen else {
        return Vec::new();
    };
    let limit = status
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds);
    let header = |name: &String, value: String| HeaderValue {
        key: name.clone(),
        value,
        ..HeaderValue::default()
    };
    vec![
        header(&names[0], limit.to_string()),
        header(&names[1], status.limit_remaining.to_string()),
        header(&names[2], reset.to_string()),
    ]
}
