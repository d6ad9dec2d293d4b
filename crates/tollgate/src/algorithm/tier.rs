//! A tier: one limit of a rule, at most `limit` permits per `period`.

use std::time::Duration;

use super::{Algorithm, Calendar, Decide, MAX_EXACT, Rate};

/// One limit of a rule: at most `limit` permits per `period`, or per calendar period (a
/// month in a time zone, see [`Calendar`]). Bucket algorithms also take a `burst` (their
/// capacity), which defaults to `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    limit: u64,
    period: Duration,
    burst: Option<u64>,
    period_micros: u64,
    rate: Rate,
    /// For a calendar period: its windows (and `period` is its longest).
    calendar: Option<Calendar>,
}

impl Tier {
    /// At most `limit` permits per `period`.
    pub fn new(limit: u64, period: Duration) -> Self {
        let period_micros = u64::try_from(period.as_micros()).unwrap_or(u64::MAX);
        Self {
            limit,
            period,
            burst: None,
            period_micros,
            rate: Rate::new(limit, period_micros),
            calendar: None,
        }
    }

    /// At most `limit` permits per calendar period: per day, week, month or year in a time
    /// zone, each window as long as the calendar makes it. Its [`period`](Self::period) is the
    /// longest such window. The fixed window and the hit counter take it; a rule of another
    /// algorithm refuses it.
    pub fn calendar(limit: u64, calendar: Calendar) -> Self {
        let longest = calendar.longest_micros();
        Self {
            calendar: Some(calendar),
            ..Self::new(limit, Duration::from_micros(longest))
        }
    }

    /// A tier of calendar windows between `bounds` only (see [`Calendar::given`]), of
    /// `period_micros` (the calendar's longest window).
    #[cfg(feature = "inside-redis")]
    pub(crate) fn given_windows(limit: u64, period_micros: u64, bounds: [u64; 4]) -> Self {
        Self {
            calendar: Some(Calendar::given(bounds)),
            ..Self::new(limit, Duration::from_micros(period_micros))
        }
    }

    /// The calendar period, for a tier of one.
    pub fn calendar_period(&self) -> Option<&Calendar> {
        self.calendar.as_ref()
    }

    /// The window holding `now` (µs): aligned to multiples of the period since the epoch, or
    /// the calendar's.
    #[inline]
    pub(crate) fn window(&self, now: u64) -> (u64, u64) {
        match &self.calendar {
            None => {
                let start = now - now % self.period_micros;
                (start, start + self.period_micros)
            }
            Some(calendar) => calendar.window(now),
        }
    }

    /// At most `limit` permits per second.
    pub fn per_second(limit: u64) -> Self {
        Self::new(limit, Duration::from_secs(1))
    }

    /// At most `limit` permits per minute.
    pub fn per_minute(limit: u64) -> Self {
        Self::new(limit, Duration::from_secs(60))
    }

    /// At most `limit` permits per hour.
    pub fn per_hour(limit: u64) -> Self {
        Self::new(limit, Duration::from_secs(3_600))
    }

    /// At most `limit` permits per day.
    pub fn per_day(limit: u64) -> Self {
        Self::new(limit, Duration::from_secs(86_400))
    }

    /// Sets the capacity of a bucket algorithm (token bucket, leaky bucket, GCRA).
    pub fn with_burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// The burst as set, `None` when it defaults to the limit.
    pub(crate) fn explicit_burst(&self) -> Option<u64> {
        self.burst
    }

    /// Permits per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The capacity of a bucket algorithm: the burst if set, else the limit.
    pub fn burst(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    pub(crate) fn period_micros(&self) -> u64 {
        self.period_micros
    }

    pub(crate) fn rate(&self) -> Rate {
        self.rate
    }

    pub(crate) fn validate(&self, algorithm: &Algorithm) -> Result<(), (&'static str, String)> {
        if self.limit == 0 {
            return Err(("limit", "must be at least 1".into()));
        }
        if self.limit >= MAX_EXACT {
            return Err(("limit", "must be below 2^53".into()));
        }
        if self.period.is_zero() {
            return Err(("period", "must be longer than zero".into()));
        }
        if !self.period.subsec_nanos().is_multiple_of(1_000) {
            return Err(("period", "must be a whole number of microseconds".into()));
        }
        if self.period_micros >= MAX_EXACT {
            return Err(("period", "must be shorter than 2^53 microseconds".into()));
        }
        if self.calendar.is_some() && !algorithm.takes_calendar() {
            return Err((
                "period",
                format!(
                    "a calendar period takes fixed_window or hit_counter, not {}: their windows \
                     begin and end with the calendar; the others measure a duration, which a \
                     month of varying length is not",
                    algorithm.name()
                ),
            ));
        }
        match self.burst {
            Some(_) if !algorithm.uses_burst() => Err((
                "burst",
                format!("is not used by the {} algorithm", algorithm.name()),
            )),
            Some(0) => Err(("burst", "must be at least 1".into())),
            Some(b) if b >= MAX_EXACT => Err(("burst", "must be below 2^53".into())),
            _ => Ok(()),
        }
    }
}
