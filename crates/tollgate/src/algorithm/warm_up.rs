//! Warm-up, after Guava's `SmoothWarmingUp`: a cold key is admitted at `cold_factor` times the
//! stable interval, and the rate ramps up to `limit` per `period` as permits are taken over the
//! warm-up period. While a key is idle it cools down again.
//!
//! As in Guava, a request is admitted when the previous ones' cost has been paid (the next free
//! time has come) and pushes the next free time forward by its own cost: the wait is paid by
//! the request after. A plain check admits only without delay (Guava's `tryAcquire()`);
//! `acquire` with a timeout may be admitted with a delay up to the timeout.
//!
//! Computed in doubles, in the same order of operations as the Redis script.
//!
//! State words: `[stored permits (f64 bits), next free time (µs; 0 = never seen)]`.

use std::time::Duration;

use super::Verdict;
use super::{Attempt, Decide, Invalid, Micros};
use super::{MAX_EXACT, Tier};

/// Parameters of [`Algorithm::WarmUp`](super::Algorithm::WarmUp).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmUp {
    /// How long the ramp from cold to stable lasts under full load; up to a day.
    pub period: Duration,
    /// How much slower than the stable rate a cold key is admitted; at least 1 (Guava: 3).
    pub cold_factor: f64,
}

impl WarmUp {
    /// A warm-up over `period`, starting three times slower than the stable rate.
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            cold_factor: 3.0,
        }
    }

    /// Sets how much slower than the stable rate a cold key is admitted.
    pub fn with_cold_factor(mut self, cold_factor: f64) -> Self {
        self.cold_factor = cold_factor;
        self
    }
}

const MAX_PERIOD: Duration = Duration::from_secs(86_400);

/// The shape of the ramp for one tier, in microseconds and permits.
#[derive(Debug, Clone, Copy)]
struct Curve {
    /// Microseconds per permit once warm.
    stable: f64,
    /// Stored permits above which admission slows down.
    threshold: f64,
    /// Stored permits of a fully cold key.
    max: f64,
    /// Extra microseconds per permit for each stored permit above the threshold.
    slope: f64,
    /// Microseconds of idleness that store one permit.
    cooldown: f64,
}

impl Curve {
    fn new(warm_up: &WarmUp, tier: &Tier) -> Self {
        let stable = tier.period_micros() as f64 / tier.limit() as f64;
        let cold = stable * warm_up.cold_factor;
        let warm = warm_up.period.as_micros() as f64;
        let threshold = 0.5 * warm / stable;
        let max = threshold + 2.0 * warm / (stable + cold);
        Self {
            stable,
            threshold,
            max,
            slope: (cold - stable) / (max - threshold),
            cooldown: warm / max,
        }
    }

    /// Microseconds per permit with `stored` permits stored.
    fn interval(&self, stored: f64) -> f64 {
        self.stable + stored * self.slope
    }

    /// The time `take` permits cost when `stored` are stored: the area under the ramp above
    /// the threshold, plus the stable interval below it.
    fn cost(&self, stored: f64, take: f64) -> f64 {
        let above = stored - self.threshold;
        let mut micros = 0.0;
        let mut take = take;
        if above > 0.0 {
            let ramp = above.min(take);
            micros = ramp * (self.interval(above) + self.interval(above - ramp)) / 2.0;
            take -= ramp;
        }
        micros + self.stable * take
    }
}

impl WarmUp {
    /// The permits stored and the next free time at `now`: a key never seen is cold, and an
    /// idle one cools down.
    fn at(&self, curve: &Curve, state: &[u64], now: u64) -> (f64, u64) {
        match state[1] {
            0 => (curve.max, now),
            next if now > next => {
                let cooled = f64::from_bits(state[0]) + (now - next) as f64 / curve.cooldown;
                (cooled.min(curve.max), now)
            }
            next => (f64::from_bits(state[0]), next),
        }
    }
}

impl Decide for WarmUp {
    fn name(&self) -> &'static str {
        "warm_up"
    }

    fn words(&self, _tier: &Tier) -> usize {
        2
    }

    fn validate(&self, tier: &Tier) -> Result<(), Invalid> {
        if self.period.is_zero() || self.period > MAX_PERIOD {
            return Err(Invalid::Parameter(
                "warm_up",
                format!(
                    "{:?} must be longer than zero and at most a day; a longer ramp is almost \
                     certainly a unit mistake",
                    self.period
                ),
            ));
        }
        if !self.period.subsec_nanos().is_multiple_of(1_000) {
            return Err(Invalid::Parameter(
                "warm_up",
                "must be a whole number of microseconds".into(),
            ));
        }
        if !(self.cold_factor.is_finite() && (1.0..=1_000.0).contains(&self.cold_factor)) {
            return Err(Invalid::Parameter(
                "cold_factor",
                format!("{} must be between 1 and 1000", self.cold_factor),
            ));
        }
        if Curve::new(self, tier).threshold < 1.0 {
            return Err(Invalid::Parameter(
                "warm_up",
                format!(
                    "{:?} is shorter than two permit intervals of {} per {:?}, so it would \
                     have no effect",
                    self.period,
                    tier.limit(),
                    tier.period()
                ),
            ));
        }
        Ok(())
    }

    #[inline]
    fn decide(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) -> Verdict {
        let curve = Curve::new(self, tier);
        let (limit, now) = (tier.limit(), attempt.now.get());
        let (stored, next) = self.at(&curve, state, now);
        let delay = next - now;
        let patience = attempt.max_delay.unwrap_or(0);
        if delay > patience {
            return Verdict::deny(limit, 0, delay, delay - patience);
        }
        let cost = attempt.cost as f64;
        let spent = cost.min(stored);
        let wait = curve.cost(stored, spent) + (cost - spent) * curve.stable;
        let next_after = next + wait.ceil() as u64;
        if attempt.writes() {
            state[0] = (stored - spent).to_bits();
            state[1] = next_after;
        }
        let remaining = if next_after <= now { limit } else { 0 };
        Verdict::allow(limit, remaining, next_after - now).with_delay(delay)
    }

    fn debit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        let now = now.get();
        let curve = Curve::new(self, tier);
        let (stored, next) = self.at(&curve, state, now);
        let cost = cost as f64;
        let spent = cost.min(stored);
        let wait = curve.cost(stored, spent) + (cost - spent) * curve.stable;
        state[0] = (stored - spent).to_bits();
        state[1] = next.saturating_add(wait.ceil() as u64).min(MAX_EXACT - 1);
    }

    /// Warm-up keeps what it took: its schedule's cost depends on how cold the key was, which
    /// a later give-back cannot undo.
    fn credit(&self, _tier: &Tier, _state: &mut [u64], _now: Micros, _cost: u64, _at: Micros) {}

    /// The permits stored, a double.
    fn double_words(&self) -> &'static [usize] {
        &[0]
    }

    fn module_parameters(&self) -> [f64; 2] {
        [self.period.as_micros() as f64, self.cold_factor]
    }

    fn script_parameters(&self, tier: &Tier) -> [f64; 5] {
        let c = Curve::new(self, tier);
        [c.stable, c.threshold, c.max, c.slope, c.cooldown]
    }

    fn expires_at(&self, tier: &Tier, state: &[u64]) -> Micros {
        let curve = Curve::new(self, tier);
        Micros::new(match state[1] {
            0 => 0,
            next => {
                // One microsecond more, so that rounding cannot leave it a hair below cold.
                let cooling = (curve.max - f64::from_bits(state[0])) * curve.cooldown;
                next + cooling.ceil() as u64 + 1
            }
        })
    }
}

/// The warm-up of the module's parameters (see [`Decide::module_parameters`]): its period in
/// µs and its cold factor.
#[cfg(feature = "inside-redis")]
pub(crate) fn of_parameters(p: [f64; 2]) -> Result<super::Algorithm, &'static str> {
    let period = Duration::from_micros(crate::layout::whole(p[0])?);
    Ok(super::Algorithm::WarmUp(
        WarmUp::new(period).with_cold_factor(p[1]),
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::WarmUp;
    use crate::algorithm::Algorithm;
    use crate::algorithm::Tier;
    use crate::algorithm::testing::{Key, SECOND};

    /// Guava's documented example: 10 per second (100 ms stable), 2 s warm-up, cold factor 3.
    fn guava_example() -> Key {
        Key::new(
            Algorithm::WarmUp(WarmUp::new(Duration::from_secs(2))),
            [Tier::per_second(10)],
        )
    }

    /// The waits between back-to-back admissions of `n` requests taken as soon as possible.
    fn intervals(key: &mut Key, n: usize) -> Vec<u64> {
        let mut waits = Vec::with_capacity(n);
        for _ in 0..n {
            let decision = key.check(1);
            assert!(decision.allowed());
            let wait = u64::try_from(decision.reset_after().as_micros()).unwrap();
            waits.push(wait / 1_000);
            key.advance(wait);
        }
        waits
    }

    #[test]
    fn a_cold_key_starts_three_times_slower_and_ramps_to_the_stable_rate() {
        let mut key = guava_example();
        let waits = intervals(&mut key, 16);
        // 20 stored permits, 10 above the threshold: from 300 ms down to 100 ms per permit.
        assert_eq!(
            waits,
            [
                290, 270, 250, 230, 210, 190, 170, 150, 130, 110, 100, 100, 100, 100, 100, 100
            ]
        );
        // The ramp took about the warm-up period: 2 s.
        assert_eq!(waits[..10].iter().sum::<u64>(), 2_000);
    }

    #[test]
    fn an_idle_key_cools_down_again() {
        let mut key = guava_example();
        intervals(&mut key, 20);
        key.advance(10 * SECOND);
        assert_eq!(intervals(&mut key, 2), [290, 270]);
    }

    #[test]
    fn a_check_is_admitted_only_once_the_previous_cost_is_paid() {
        let mut key = guava_example();
        assert!(key.check(1).allowed());
        let denied = key.check(1);
        assert_eq!(denied.retry_after().unwrap().as_millis(), 290);
        assert!(key.retry_after_is_exact(1));
    }

    #[test]
    fn a_caller_that_accepts_a_delay_is_admitted_with_it() {
        let mut key = guava_example();
        assert!(key.check(1).allowed());
        let waited = key.attempt(1, Some(300_000));
        assert!(waited.allowed());
        assert_eq!(waited.delay().as_millis(), 290);
    }
}
