//! Retrying a throttled call: exponential backoff with full jitter, capped, that never retries
//! before the server said to (`Retry-After` in seconds or as an HTTP date, or the IETF
//! `RateLimit` field's `t`), within a budget of retries and of total waiting.
//!
//! [`retry`] wraps any fallible future; with the `tower` feature, [`RetryPolicy`] is the same
//! as a `tower::retry::Policy` for HTTP clients.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::retry::{Backoff, Verdict, retry};
//! use tollgate::SystemClock;
//!
//! # async fn call() -> Result<&'static str, (u16, Option<Duration>)> { Ok("done") }
//! # async fn run() -> Result<(), (u16, Option<Duration>)> {
//! let answer = retry(&SystemClock::new(), Backoff::default(), || call(), |err| match err {
//!     (429 | 503, hint) => Verdict::RetryAfter(*hint),
//!     _ => Verdict::Fail,
//! })
//! .await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::clock::Clock;

/// How long and how often to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first retry waits a random time up to this; each retry doubles it (default 100 ms).
    pub base: Duration,
    /// No single random wait is longer (default 30 s); a server's hint may be longer.
    pub max: Duration,
    /// The most retries (default 5).
    pub retries: u32,
    /// The most time spent waiting in all; a retry that would go past it is not made (default
    /// 60 s).
    pub budget: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(100),
            max: Duration::from_secs(30),
            retries: 5,
            budget: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The wait before retry number `attempt` (from 0), with `unit` a uniform random number in
    /// `[0, 1)`: full jitter, `unit x min(max, base x 2^attempt)`, but never less than `hint`,
    /// the server's own wait.
    pub fn wait(&self, attempt: u32, hint: Option<Duration>, unit: f64) -> Duration {
        let ceiling = self
            .base
            .checked_mul(1_u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
            .unwrap_or(self.max)
            .min(self.max);
        let jitter = ceiling.mul_f64(unit.clamp(0.0, 1.0));
        hint.map_or(jitter, |h| jitter.max(h))
    }
}

/// What to do about a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Give up: the error is final.
    Fail,
    /// Retry, not before the hint when there is one.
    RetryAfter(Option<Duration>),
}

/// Calls `op` until it succeeds, `classify` calls its error final, the retries are spent, or
/// the next wait would go past the budget; returns the last result. Waits on `clock`, so a
/// [`ManualClock`](crate::ManualClock) makes it instant in tests.
///
/// # Errors
/// The last attempt's error.
pub async fn retry<C, F, Fut, T, E>(
    clock: &C,
    backoff: Backoff,
    mut op: F,
    classify: impl Fn(&E) -> Verdict,
) -> Result<T, E>
where
    C: Clock,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut random = Random::seeded(clock.now_micros());
    let mut waited = Duration::ZERO;
    let mut attempt = 0;
    loop {
        let error = match op().await {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let Verdict::RetryAfter(hint) = classify(&error) else {
            return Err(error);
        };
        if attempt >= backoff.retries {
            return Err(error);
        }
        let wait = backoff.wait(attempt, hint, random.unit());
        if waited + wait > backoff.budget {
            return Err(error);
        }
        clock.sleep(wait).await;
        waited += wait;
        attempt += 1;
    }
}

/// Parses a `Retry-After` value: whole seconds, or an HTTP date (a date in the past is no
/// wait). Whole seconds are exact; a date is read against `now`.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The wait the IETF `RateLimit` field asks for: the longest `t` (seconds) of the policies
/// it lists with nothing remaining (`r=0`), e.g. `"day";r=0;t=3600`.
pub fn parse_ratelimit(value: &str) -> Option<Duration> {
    value
        .split(',')
        .filter_map(|item| {
            let mut remaining = None;
            let mut reset = None;
            for param in item.split(';').skip(1) {
                match param.trim().split_once('=') {
                    Some(("r", r)) => remaining = r.trim().parse::<u64>().ok(),
                    Some(("t", t)) => reset = t.trim().parse::<u64>().ok(),
                    _ => {}
                }
            }
            (remaining == Some(0)).then_some(reset?)
        })
        .max()
        .map(Duration::from_secs)
}

/// A small generator of jitter (xorshift64*): not for secrets.
struct Random(u64);

impl Random {
    fn seeded(seed: u64) -> Self {
        // Mixed with an address, so processes started in the same microsecond differ.
        let salt = &seed as *const u64 as u64;
        Self((seed ^ salt.rotate_left(32)) | 1)
    }

    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let n = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (n >> 11) as f64 / (1_u64 << 53) as f64
    }
}

#[cfg(feature = "tower")]
pub use policy::RetryPolicy;

#[cfg(feature = "tower")]
mod policy {
    use std::future::Future;
    use std::pin::Pin;
    use std::time::{Duration, SystemTime};

    use http::{Request, Response, StatusCode};

    use super::{Backoff, Random, parse_ratelimit, parse_retry_after};

    /// A `tower::retry::Policy` for HTTP clients: retries a 429 or a 503, after the
    /// `Retry-After` or `RateLimit` wait when the answer gives one, else after the backoff's
    /// jittered wait, within its retries and budget. Requests must be cloneable (their body
    /// too). Waits with Tokio's timer.
    #[derive(Debug, Clone)]
    pub struct RetryPolicy {
        backoff: Backoff,
        attempt: u32,
        waited: Duration,
        seed: u64,
    }

    impl RetryPolicy {
        /// A policy of `backoff`.
        pub fn new(backoff: Backoff) -> Self {
            let seed = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            Self {
                backoff,
                attempt: 0,
                waited: Duration::ZERO,
                seed,
            }
        }

        /// The server's wait, from an answer's headers.
        pub fn hint<B>(response: &Response<B>) -> Option<Duration> {
            let headers = response.headers();
            let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
            let retry_after = header(http::header::RETRY_AFTER.as_str())
                .and_then(|v| parse_retry_after(v, SystemTime::now()));
            let ratelimit = header("ratelimit").and_then(parse_ratelimit);
            retry_after.max(ratelimit)
        }
    }

    type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

    impl<B: Clone, R, E> tower::retry::Policy<Request<B>, Response<R>, E> for RetryPolicy {
        type Future = Sleep;

        fn retry(
            &mut self,
            _request: &mut Request<B>,
            result: &mut Result<Response<R>, E>,
        ) -> Option<Self::Future> {
            let response = result.as_ref().ok()?;
            let status = response.status();
            if status != StatusCode::TOO_MANY_REQUESTS && status != StatusCode::SERVICE_UNAVAILABLE
            {
                return None;
            }
            if self.attempt >= self.backoff.retries {
                return None;
            }
            let mut random = Random::seeded(self.seed ^ u64::from(self.attempt));
            let wait = self
                .backoff
                .wait(self.attempt, Self::hint(response), random.unit());
            if self.waited + wait > self.backoff.budget {
                return None;
            }
            self.attempt += 1;
            self.waited += wait;
            Some(Box::pin(tokio::time::sleep(wait)))
        }

        fn clone_request(&mut self, request: &Request<B>) -> Option<Request<B>> {
            let mut clone = Request::new(request.body().clone());
            *clone.method_mut() = request.method().clone();
            *clone.uri_mut() = request.uri().clone();
            *clone.version_mut() = request.version();
            *clone.headers_mut() = request.headers().clone();
            Some(clone)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_retry_after_and_ratelimit() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2026 07:28:00 GMT").unwrap();
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2026 07:29:30 GMT", now),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2026 07:27:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(
            parse_ratelimit("\"api\";r=0;t=30"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_ratelimit("\"a\";r=5;t=30, \"b\";r=0;t=7"),
            Some(Duration::from_secs(7))
        );
        assert_eq!(parse_ratelimit("\"a\";r=5;t=30"), None);
    }

    proptest! {
        /// Full jitter: every wait lies in [hint, max(hint, min(max, base x 2^attempt))].
        #[test]
        fn waits_stay_within_their_bounds(attempt in 0u32..40, unit in 0.0f64..1.0, hint_ms in proptest::option::of(0u64..100_000)) {
            let b = Backoff::default();
            let hint = hint_ms.map(Duration::from_millis);
            let wait = b.wait(attempt, hint, unit);
            let ceiling = (b.base * 2u32.saturating_pow(attempt.min(20))).min(b.max);
            prop_assert!(wait >= hint.unwrap_or_default());
            prop_assert!(wait <= ceiling.max(hint.unwrap_or_default()));
        }
    }

    /// The generator spreads waits over the whole range: each tenth of [0, ceiling) is hit by
    /// between 5% and 15% of 10,000 draws.
    #[test]
    fn jitter_spreads_over_the_whole_range() {
        let b = Backoff::default();
        let mut random = Random::seeded(42);
        let mut deciles = [0u32; 10];
        for _ in 0..10_000 {
            let wait = b.wait(3, None, random.unit());
            let decile = (wait.as_secs_f64() / 0.8 * 10.0) as usize;
            deciles[decile.min(9)] += 1;
        }
        assert!(
            deciles.iter().all(|&n| (500..1_500).contains(&n)),
            "{deciles:?}"
        );
    }
}
