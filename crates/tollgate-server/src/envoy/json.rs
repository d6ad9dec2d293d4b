//! Envoy's rate limit messages in protobuf's JSON mapping, as envoyproxy/ratelimit's
//! `POST /json` reads and writes them: lowerCamelCase field names (the proto's own names
//! accepted too), enums by name (or number), 64-bit integers as strings (or numbers),
//! durations as `"60s"`, and fields of default value left out of answers.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{Map, Value, json};

/// A `RateLimitRequest` from its JSON form.
///
/// # Errors
/// What is not JSON, or not a request: an unknown field, a value of the wrong type.
pub fn request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let fields = object(&value, "the request")?;
    let mut request = RateLimitRequest::default();
    for (name, value) in fields {
        match name.as_str() {
            "domain" => request.domain = string(value, name)?,
            "descriptors" => {
                for d in array(value, name)? {
                    request.descriptors.push(descriptor(d)?);
                }
            }
            "hitsAddend" | "hits_addend" => {
                request.hits_addend = u32::try_from(integer(value, name)?)
                    .map_err(|_| format!("{name}: above 4294967295"))?;
            }
            other => return Err(format!("unknown field `{other}` in the request")),
        }
    }
    Ok(request)
}

fn descriptor(value: &Value) -> Result<RateLimitDescriptor, String> {
    let mut descriptor = RateLimitDescriptor::default();
    for (name, value) in object(value, "a descriptor")? {
        match name.as_str() {
            "entries" => {
                for e in array(value, name)? {
                    let mut entry = Entry::default();
                    for (name, value) in object(e, "an entry")? {
                        match name.as_str() {
                            "key" => entry.key = string(value, name)?,
                            "value" => entry.value = string(value, name)?,
                            other => return Err(format!("unknown field `{other}` in an entry")),
                        }
                    }
                    descriptor.entries.push(entry);
                }
            }
            "limit" => {
                let mut limit = RateLimitOverride::default();
                for (name, value) in object(value, "a limit")? {
                    match name.as_str() {
                        "requestsPerUnit" | "requests_per_unit" => {
                            limit.requests_per_unit = u32::try_from(integer(value, name)?)
                                .map_err(|_| format!("{name}: above 4294967295"))?;
                        }
                        "unit" => limit.unit = unit(value)? as i32,
                        other => return Err(format!("unknown field `{other}` in a limit")),
                    }
                }
                descriptor.limit = Some(limit);
            }
            "hitsAddend" | "hits_addend" => {
                descriptor.hits_addend = Some(UInt64Value {
                    value: integer(value, name)?,
                });
            }
            "isNegativeHits" | "is_negative_hits" => {
                descriptor.is_negative_hits = value
                    .as_bool()
                    .ok_or_else(|| format!("{name}: expected true or false"))?;
            }
            other => return Err(format!("unknown field `{other}` in a descriptor")),
        }
    }
    Ok(descriptor)
}

fn object<'a>(value: &'a Value, what: &str) -> Result<&'a Map<String, Value>, String> {
    value
        .as_object()
        .ok_or_else(|| format!("{what} must be an object"))
}

fn array<'a>(value: &'a Value, name: &str) -> Result<&'a [Value], String> {
    match value {
        Value::Array(items) => Ok(items),
        Value::Null => Ok(&[]),
        _ => Err(format!("{name} must be an array")),
    }
}

fn string(value: &Value, name: &str) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        _ => Err(format!("{name} must be a string")),
    }
}

/// A non-negative integer, as a number or a string of digits.
fn integer(value: &Value, name: &str) -> Result<u64, String> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        Value::Null => Some(0),
        _ => None,
    }
    .ok_or_else(|| format!("{name} must be a whole number of at least 0"))
}

fn unit(value: &Value) -> Result<Unit, String> {
    match value {
        Value::String(name) => Unit::from_str_name(name),
        Value::Number(n) => n.as_i64().and_then(|n| Unit::try_from(n as i32).ok()),
        _ => None,
    }
    .ok_or_else(|| format!("unit: unknown unit {value}"))
}

/// The JSON form of `response`.
pub fn response(response: &RateLimitResponse) -> Value {
    let mut fields = Map::new();
    insert_code(&mut fields, "overallCode", response.overall_code);
    if !response.statuses.is_empty() {
        let statuses = response.statuses.iter().map(status).collect();
        fields.insert("statuses".into(), Value::Array(statuses));
    }
    if !response.response_headers_to_add.is_empty() {
        let headers = response
            .response_headers_to_add
            .iter()
            .map(|h: &HeaderValue| json!({ "key": h.key, "value": h.value }))
            .collect();
        fields.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(fields)
}

fn status(status: &DescriptorStatus) -> Value {
    let mut fields = Map::new();
    insert_code(&mut fields, "code", status.code);
    if let Some(limit) = &status.current_limit {
        let mut l = Map::new();
        if !limit.name.is_empty() {
            l.insert("name".into(), limit.name.clone().into());
        }
        if limit.requests_per_unit != 0 {
            l.insert("requestsPerUnit".into(), limit.requests_per_unit.into());
        }
        if let Ok(unit) = Unit::try_from(limit.unit)
            && unit != Unit::Unknown
        {
            l.insert("unit".into(), unit.as_str_name().into());
        }
        fields.insert("currentLimit".into(), Value::Object(l));
    }
    if status.limit_remaining != 0 {
        fields.insert("limitRemaining".into(), status.limit_remaining.into());
    }
    if let Some(reset) = &status.duration_until_reset {
        fields.insert(
            "durationUntilReset".into(),
            format!("{}s", reset.seconds).into(),
        );
    }
    Value::Object(fields)
}

fn insert_code(fields: &mut Map<String, Value>, name: &str, code: i32) {
    if let Ok(code) = Code::try_from(code)
        && code != Code::Unknown
    {
        fields.insert(name.into(), code.as_str_name().into());
    }
}
