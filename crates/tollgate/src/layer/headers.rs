//! The rate limit fields of an HTTP answer, from its decisions: `X-RateLimit-Limit`,
//! `-Remaining` and `-Reset` of the binding decision, `Retry-After` when it denies (whole
//! seconds, rounded up: never early), and the IETF fields of
//! draft-ietf-httpapi-ratelimit-headers: `RateLimit-Policy` (every rule's quota and window)
//! and `RateLimit` (the binding rule's remaining permits and seconds to wait or to reset).

use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::decision::Decision;

const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Appends one item of a structured field: `"rule";a=1;b=2`.
fn item(out: &mut String, rule: &str, a: (char, u64), b: (char, u64)) {
    use std::fmt::Write as _;
    out.push('"');
    out.push_str(rule);
    out.push('"');
    for (name, value) in [a, b] {
        out.push(';');
        out.push(name);
        out.push('=');
        let _ = write!(out, "{value}");
    }
}

/// Seconds, rounded up: a client that waits this long is never early.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_micros().div_ceil(1_000_000) as u64
}

/// The decision that binds `decisions`: the denial with the longest wait, else the admission
/// with the least remaining.
pub fn binding(decisions: &[Decision]) -> Option<&Decision> {
    decisions
        .iter()
        .filter(|d| !d.allowed())
        .max_by_key(|d| d.retry_after())
        .or_else(|| decisions.iter().min_by_key(|d| d.remaining()))
}

/// Adds the rate limit fields of `decisions` to `headers` (none when there are none).
pub fn add(headers: &mut HeaderMap, decisions: &[Decision]) {
    let Some(binding) = binding(decisions) else {
        return;
    };
    headers.insert(X_LIMIT, HeaderValue::from(binding.limit()));
    headers.insert(X_REMAINING, HeaderValue::from(binding.remaining()));
    headers.insert(X_RESET, HeaderValue::from(ceil_secs(binding.reset_after())));
    if let Some(retry) = binding.retry_after() {
        headers.insert(RETRY_AFTER, HeaderValue::from(ceil_secs(retry)));
    }
    // One buffer per field, no intermediate strings: this runs on every answer.
    let mut policy = String::with_capacity(48 * decisions.len());
    for (i, d) in decisions.iter().enumerate() {
        if i > 0 {
            policy.push_str(", ");
        }
        item(
            &mut policy,
            d.rule(),
            ('q', d.limit()),
            ('w', ceil_secs(d.window())),
        );
    }
    if let Ok(value) = HeaderValue::try_from(policy) {
        headers.insert(POLICY, value);
    }
    let wait = binding.retry_after().unwrap_or(binding.reset_after());
    let mut ratelimit = String::with_capacity(48);
    let (remaining, wait) = (('r', binding.remaining()), ('t', ceil_secs(wait)));
    item(&mut ratelimit, binding.rule(), remaining, wait);
    if let Ok(value) = HeaderValue::try_from(ratelimit) {
        headers.insert(RATELIMIT, value);
    }
}
