//! The algorithms: pure state transitions with no I/O.
//!
//! An algorithm keeps, per key and tier, a fixed number of `u64` state words; all zeros is the
//! state of a key never seen, so a store can start from zeros and drop any state that has
//! become equivalent to zeros. [`Decide::decide`] reads the words at `now`, and when the attempt
//! is admitted with `commit` set, writes the new state. The Redis functions implement the same
//! transitions over the same words (a key's value: one little-endian double per word, see
//! `layout`) and are checked against these; tollgate's Redis module runs these themselves.
//!
//! Every intermediate integer stays below 2^53 (rules are validated for it), so a script
//! computing in doubles reaches the same decisions.

mod calendar;
mod concurrency;
mod fixed_window;
mod gcra;
mod hit_counter;
mod interval_bucket;
mod leaky_bucket;
mod micros;
mod rate;
mod sliding_log;
mod sliding_window;
mod sub_windows;
mod tier;
mod token_bucket;
mod verdict;
mod warm_up;

pub use calendar::{Calendar, CalendarUnit, UnknownTimeZone, Weekday};
pub use leaky_bucket::LeakyBucket;
pub use sub_windows::SubWindows;
pub use token_bucket::TokenBucket;
pub use warm_up::WarmUp;

#[cfg(feature = "inside-redis")]
pub(crate) use leaky_bucket::of_parameters as leaky_bucket_of;
pub(crate) use micros::Micros;
pub(crate) use rate::{MAX_EXACT, Rate};
#[cfg(feature = "inside-redis")]
pub(crate) use sub_windows::of_parameters as sub_windows_of;
pub use tier::Tier;
#[cfg(feature = "inside-redis")]
pub(crate) use token_bucket::of_parameters as token_bucket_of;
pub(crate) use verdict::Verdict;
#[cfg(feature = "inside-redis")]
pub(crate) use warm_up::of_parameters as warm_up_of;

use concurrency::Concurrency;
pub(crate) use fixed_window::FixedWindow;
use gcra::Gcra;
use hit_counter::HitCounter;
use interval_bucket::IntervalBucket;
use sliding_log::SlidingLog;
pub(crate) use sliding_window::SlidingWindow;

/// The rate-limiting algorithm of a rule, with its parameters.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Algorithm {
    /// Counts permits per window aligned to multiples of the period since the Unix epoch.
    /// Admits up to twice the limit across a window edge.
    FixedWindow,
    /// Sliding window counter: the previous aligned window's count, weighted by how much of it
    /// the sliding window still overlaps, plus the current window's count. Approximate.
    SlidingWindow,
    /// Sentinel-style sliding window made of `count` aligned sub-windows; precision grows with
    /// the count.
    SubWindows(SubWindows),
    /// Exact: no window of length `period` ever holds more than `limit` permits. Keeps one
    /// timestamp per permit of the limit (8 bytes x limit per key in memory).
    SlidingLog,
    /// Token bucket of capacity `burst`, refilled continuously at `limit` per `period`.
    TokenBucket(TokenBucket),
    /// Refilled to the full `limit` once per `period`, the period starting at the first
    /// request after the previous one ended. A hard cap: never a burst above the limit.
    IntervalBucket,
    /// Leaky bucket of capacity `burst` leaking `limit` per `period`, as a meter (rejects on
    /// overflow) or as a shaper (admits with a delay until the water ahead has leaked).
    LeakyBucket(LeakyBucket),
    /// Generic cell rate algorithm: the leaky bucket meter kept as one theoretical arrival time.
    Gcra,
    /// The permitted rate ramps from a cold rate up to `limit` per `period` over a warm-up
    /// period, as Guava's `SmoothWarmingUp` does.
    WarmUp(WarmUp),
    /// A fixed window that counts every hit, admitted or not, as the Envoy rate limit service
    /// does: over the limit once the window's hits exceed it, and a cost above the limit is
    /// over rather than an error. What Envoy domains use.
    HitCounter,
    /// A cap on work in flight: `limit` slots per key, each held from the check that takes it
    /// until it is released or its lease (the tier's `period`) ends. Not a rate.
    Concurrency,
}

impl Algorithm {
    /// Calls `visit` with this algorithm's implementation, so a whole check is statically
    /// dispatched once rather than per tier.
    #[inline]
    pub(crate) fn dispatch<'a, V: Visit<'a>>(&'a self, visit: V) -> V::Output {
        match self {
            Self::FixedWindow => visit.visit(&FixedWindow),
            Self::SlidingWindow => visit.visit(&SlidingWindow),
            Self::SubWindows(a) => visit.visit(a),
            Self::SlidingLog => visit.visit(&SlidingLog),
            Self::TokenBucket(a) => visit.visit(a),
            Self::IntervalBucket => visit.visit(&IntervalBucket),
            Self::LeakyBucket(a) => visit.visit(a),
            Self::Gcra => visit.visit(&Gcra),
            Self::WarmUp(a) => visit.visit(a),
            Self::HitCounter => visit.visit(&HitCounter),
            Self::Concurrency => visit.visit(&Concurrency),
        }
    }

    fn imp(&self) -> &dyn Decide {
        struct AsDyn;
        impl<'a> Visit<'a> for AsDyn {
            type Output = &'a dyn Decide;
            fn visit<A: Decide>(self, algorithm: &'a A) -> &'a dyn Decide {
                algorithm
            }
        }
        self.dispatch(AsDyn)
    }

    /// The algorithm's name, as written in rule files.
    pub fn name(&self) -> &'static str {
        self.imp().name()
    }

    /// Whether a check takes slots held until released or their lease ends
    /// ([`Concurrency`](Self::Concurrency)), rather than permits of a rate.
    pub fn holds_slots(&self) -> bool {
        self.imp().holds_slots()
    }

    /// Whether a [credit](Decide::credit) at once undoes a take exactly, as a check across
    /// Redis Cluster slots gives back what one slot took when another denied: all but
    /// warm-up, whose schedule's cost depends on how cold the key was.
    #[cfg(feature = "redis")]
    pub(crate) fn gives_back(&self) -> bool {
        !matches!(self, Self::WarmUp(_))
    }
}

impl Decide for Algorithm {
    fn name(&self) -> &'static str {
        self.imp().name()
    }
    fn uses_burst(&self) -> bool {
        self.imp().uses_burst()
    }
    fn takes_calendar(&self) -> bool {
        self.imp().takes_calendar()
    }
    fn words(&self, tier: &Tier) -> usize {
        self.imp().words(tier)
    }
    fn capacity(&self, tier: &Tier) -> u64 {
        self.imp().capacity(tier)
    }
    fn validate(&self, tier: &Tier) -> Result<(), Invalid> {
        self.imp().validate(tier)
    }
    fn decide(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) -> Verdict {
        self.imp().decide(tier, state, attempt)
    }
    fn denied(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) {
        self.imp().denied(tier, state, attempt)
    }
    fn debit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        self.imp().debit(tier, state, now, cost)
    }
    fn credit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64, at: Micros) {
        self.imp().credit(tier, state, now, cost, at)
    }
    fn renew(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64) {
        self.imp().renew(tier, state, now, cost)
    }
    fn holds_slots(&self) -> bool {
        self.imp().holds_slots()
    }
    fn expires_at(&self, tier: &Tier, state: &[u64]) -> Micros {
        self.imp().expires_at(tier, state)
    }
    fn script_parameters(&self, tier: &Tier) -> [f64; 5] {
        self.imp().script_parameters(tier)
    }
    fn module_parameters(&self) -> [f64; 2] {
        self.imp().module_parameters()
    }
    fn layout(&self, tier: &Tier, feed: &mut dyn FnMut(u64)) {
        self.imp().layout(tier, feed)
    }
    fn adopt(&self, old: &Tier, from: &[u64], new: &Tier, to: &mut [u64]) {
        self.imp().adopt(old, from, new, to)
    }
    fn forgets(&self) -> bool {
        self.imp().forgets()
    }
    fn double_words(&self) -> &'static [usize] {
        self.imp().double_words()
    }
}

/// A computation generic over the algorithm; see [`Algorithm::dispatch`].
pub(crate) trait Visit<'a> {
    type Output;
    fn visit<A: Decide>(self, algorithm: &'a A) -> Self::Output;
}

/// One check of one tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// Since the Unix epoch, at least 1 µs (0 marks "never" in state words).
    pub(crate) now: Micros,
    /// Permits asked for; 0 looks without consuming.
    pub(crate) cost: u64,
    /// The longest delay the caller accepts from a shaping algorithm; `None` for a plain check
    /// (the shaper's own bound applies, and warm-up admits only without delay).
    pub(crate) max_delay: Option<u64>,
    /// Whether to write the new state when admitted.
    pub(crate) commit: bool,
    /// A settlement instead of a check: the cost is taken or given back whatever the
    /// tier's state (see [`Decide::debit`], [`Decide::credit`]).
    pub(crate) settle: Option<Settle>,
}

/// What a settlement does to each item of a batch: takes its cost whatever the key's state,
/// or gives it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Takes each item's cost, past the limit if need be (the key is then in debt): a report
    /// of work whose cost is known after it is done.
    Report,
    /// Gives back each item's cost, taken at `at` (µs since the Unix epoch), where the
    /// algorithm can: what a reservation did not use.
    Credit {
        /// When the cost was taken.
        at: u64,
    },
    /// Renews the lease of each item's cost in slots held, from now: a concurrency holder
    /// still at work. Nothing to other algorithms.
    Renew,
}

impl Attempt {
    /// A look at `now`: a check of no cost that writes nothing.
    pub(crate) fn look(now: Micros) -> Self {
        Self {
            now,
            cost: 0,
            max_delay: None,
            commit: false,
            settle: None,
        }
    }

    /// Whether an admitted attempt must write its new state.
    pub(crate) fn writes(&self) -> bool {
        self.commit && self.cost > 0
    }
}

/// Why a tier does not fit an algorithm: blames a tier field or an algorithm parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Invalid {
    Tier(&'static str, String),
    Parameter(&'static str, String),
}

/// An algorithm's pure transition and what a store needs to know about its state.
pub(crate) trait Decide {
    /// The name used in rule files.
    fn name(&self) -> &'static str;

    /// Whether the tier's `burst` means something to this algorithm.
    fn uses_burst(&self) -> bool {
        false
    }

    /// Whether a tier of a calendar period (see [`Calendar`]) means something to it: its
    /// windows begin and end with the calendar's.
    fn takes_calendar(&self) -> bool {
        false
    }

    /// State words per key for this tier.
    fn words(&self, tier: &Tier) -> usize;

    /// The largest cost this tier can ever admit.
    fn capacity(&self, tier: &Tier) -> u64 {
        tier.limit()
    }

    /// Rejects parameters that can never work with this tier. Called once, at rule build.
    fn validate(&self, _tier: &Tier) -> Result<(), Invalid> {
        Ok(())
    }

    /// Decides `attempt` against one tier's `state` (`words(tier)` words), writing the new
    /// state only when admitted and [`Attempt::writes`]. Never admits a cost above `capacity`.
    /// The verdict is the same whether it writes or not (the Redis functions decide a batch in
    /// one pass that writes).
    fn decide(&self, tier: &Tier, state: &mut [u64], attempt: &Attempt) -> Verdict;

    /// Whether an expired state differs from a key never seen (a bucket that starts partly
    /// empty, once refilled). Rules of such an algorithm treat a key's state as new once every
    /// tier has expired, so that the decision does not depend on when a store drops it.
    fn forgets(&self) -> bool {
        false
    }

    /// Called when `attempt`, a check that would write, was denied (by this tier or by
    /// another tier or item of its batch): what a denial records. An algorithm whose fresh
    /// state depends on when the key appeared (a token bucket that starts partly empty)
    /// records that moment, so the key starts refilling; the hit counter counts the hits when
    /// this tier itself is over. Nothing else consumes.
    fn denied(&self, _tier: &Tier, _state: &mut [u64], _attempt: &Attempt) {}

    /// Takes `cost` permits at `now` whatever the tier's state: a report of work done. Past the
    /// limit the key is in debt, and checks are denied until the passing of time pays it back:
    /// a bucket (token, leaky, GCRA) refills through its debt at its rate; a window's debt ends
    /// with the window (the sliding window counter carries a share of it into the next window
    /// through its weighting); the sliding log keeps at most `limit` entries, so a report past
    /// its limit fills it (a look admits, a permit does not) for at most one period.
    /// Quantities saturate below 2^53.
    fn debit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64);

    /// Gives back `cost` permits taken at `at` (µs; a reservation that used less than its
    /// estimate, or none of it), where the algorithm can: a window gives back while the
    /// permits still count (the window of `at` is current, or the previous one for the
    /// sliding window counter), a bucket lowers its level (never below empty), the sliding
    /// log drops up to `cost` entries logged at or after `at`; warm-up keeps what it took.
    /// Never gives back more than is counted.
    fn credit(&self, tier: &Tier, state: &mut [u64], now: Micros, cost: u64, at: Micros);

    /// Renews the lease of `cost` slots held at `now` (see [`Settle::Renew`]); nothing but
    /// for an algorithm that [holds slots](Self::holds_slots).
    fn renew(&self, _tier: &Tier, _state: &mut [u64], _now: Micros, _cost: u64) {}

    /// Whether a check takes slots held until given back, rather than permits of a rate: a
    /// reservation's items of such a rule give their whole cost back when it is settled,
    /// whatever its real cost.
    fn holds_slots(&self) -> bool {
        false
    }

    /// The time (µs since the epoch) from which `state` is equivalent to all zeros and may be
    /// dropped; the TTL a store gives it.
    fn expires_at(&self, tier: &Tier, state: &[u64]) -> Micros;

    /// The algorithm's parameters for one tier as its Redis script reads them (`p1`..`p5`).
    /// Doubles computed here reach the script unchanged, so both compute with the same ones.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn script_parameters(&self, _tier: &Tier) -> [f64; 5] {
        [0.0; 5]
    }

    /// The algorithm's own parameters as tollgate's Redis module reads them from a rule's
    /// argument (see `layout::ALGORITHMS`, whose row decodes them).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn module_parameters(&self) -> [f64; 2] {
        [0.0; 2]
    }

    /// Feeds what gives this tier's state words their meaning: by default the period and the
    /// number of words, so that a new limit or burst keeps the state (see
    /// [`Rule::fingerprint`](crate::Rule)).
    fn layout(&self, tier: &Tier, feed: &mut dyn FnMut(u64)) {
        feed(tier.period_micros());
        feed(self.words(tier) as u64);
    }

    /// Which of a tier's state words hold the bits of a double rather than an integer; the
    /// Redis functions keep the double itself.
    #[cfg_attr(not(feature = "inside-redis"), allow(dead_code))]
    fn double_words(&self) -> &'static [usize] {
        &[]
    }

    /// Rewrites one tier's state `from`, kept under `old`, for `new`: two tiers of the same
    /// layout. By default the words mean the same under both and are copied.
    fn adopt(&self, _old: &Tier, from: &[u64], _new: &Tier, to: &mut [u64]) {
        to.copy_from_slice(from);
    }
}

#[cfg(test)]
mod properties;
#[cfg(test)]
pub(crate) mod testing;
