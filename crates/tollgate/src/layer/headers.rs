//! The rate limit fields of an HTTP answer, from its decisions: `X-RateLimit-Limit`,
//! `-Remaining` and `-Reset` of the binding decision (its tier's capacity, what it would
//! still admit now, and the seconds from now until it is full again), `Retry-After` when it
//! denies (whole seconds, rounded up: never early), and the IETF fields of
//! draft-ietf-httpapi-ratelimit-headers: `RateLimit-Policy` (every tier of every rule that
//! decided, each as a quota a client may rely on per window of whole seconds: a bucket's
//! burst per the time that burst takes to refill) and `RateLimit` (the binding tier's policy,
//! remaining permits and seconds to wait or to reset).

use std::ops::Range;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::decision::Decision;

const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Every field's value, written into one buffer: the fields are slices of it, so an answer's
/// fields cost one allocation, not one each (this runs on every answer).
struct Values(Vec<u8>);

impl Values {
    /// Appends a number; its range in the buffer.
    fn number(&mut self, n: u64) -> Range<usize> {
        let start = self.0.len();
        self.0
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        start..self.0.len()
    }

    /// Appends one item of a structured field: `"rule";a=1;b=2`.
    fn item(&mut self, rule: &str, a: (u8, u64), b: (u8, u64)) {
        self.0.push(b'"');
        self.0.extend_from_slice(rule.as_bytes());
        self.0.push(b'"');
        for (name, value) in [a, b] {
            self.0.extend_from_slice(&[b';', name, b'=']);
            self.number(value);
        }
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

/// Adds the rate limit fields of `decisions` to `headers` (none when there are none). A rule
/// name that cannot stand in a field leaves out the IETF fields.
pub fn add(headers: &mut HeaderMap, decisions: &[Decision]) {
    let Some(binding) = binding(decisions) else {
        return;
    };
    let mut values = Values(Vec::with_capacity(64 + 48 * decisions.len()));
    let limit = values.number(binding.limit());
    let remaining = values.number(binding.remaining());
    let reset = values.number(ceil_secs(binding.reset_after()));
    let retry = binding.retry_after().map(|r| values.number(ceil_secs(r)));
    let start = values.0.len();
    // Each rule's tiers once, however many of its keys the answer decided.
    let mut seen = std::collections::HashSet::new();
    for (i, d) in decisions.iter().enumerate() {
        let repeated = if decisions.len() <= 16 {
            decisions[..i].iter().any(|earlier| earlier.same_rule(d))
        } else {
            !seen.insert(d.policies().as_ptr())
        };
        if repeated {
            continue;
        }
        for policy in d.policies() {
            if values.0.len() > start {
                values.0.extend_from_slice(b", ");
            }
            values.item(&policy.name, (b'q', policy.quota), (b'w', policy.window));
        }
    }
    let policy = start..values.0.len();
    let wait = binding.retry_after().unwrap_or(binding.reset_after());
    let start = values.0.len();
    let (left, wait) = ((b'r', binding.remaining()), (b't', ceil_secs(wait)));
    values.item(&binding.policy().name, left, wait);
    let ratelimit = start..values.0.len();

    let values = Bytes::from(values.0);
    let field = |range: Range<usize>| HeaderValue::from_maybe_shared(values.slice(range)).ok();
    // Room for exactly these fields: reserving more than needed rehashes a map that had room.
    headers.reserve(5 + usize::from(retry.is_some()));
    for (name, range) in [(X_LIMIT, limit), (X_REMAINING, remaining), (X_RESET, reset)] {
        if let Some(value) = field(range) {
            headers.insert(name, value);
        }
    }
    if let Some(value) = retry.and_then(field) {
        headers.insert(RETRY_AFTER, value);
    }
    for (name, range) in [(POLICY, policy), (RATELIMIT, ratelimit)] {
        if let Some(value) = field(range) {
            headers.insert(name, value);
        }
    }
}
