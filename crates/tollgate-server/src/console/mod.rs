//! The console: what the service decided lately and on which keys, kept in memory bounded
//! whatever the traffic, for the page at `/console` and its JSON API (`/v1/console/...`, see
//! `crate::http::console`). On only when an admin token is configured; then each decision adds to fixed
//! rings (per second for two minutes, per minute for an hour: [`series`]) and to Space-Saving
//! summaries of each rule's hottest keys ([`top`]), and each HTTP request checked is kept for
//! the impact preview within a byte budget ([`recorder`]). Off, a check pays one atomic load.
//! Instances on one Redis publish a summary there ([`instances`]), so any console shows all.

pub mod instances;
pub mod preview;
pub mod recorder;
pub mod series;
pub mod shard;
pub mod top;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tollgate::Decision;
use tollgate::engine::{Headers, Request};

use series::Series;
use shard::{Histogram, Kept, Shard};

/// Audit entries kept.
const AUDIT: usize = 500;

/// The most shards: past this many cores, threads share them.
pub const MAX_SHARDS: usize = 16;

/// How long requests are still recorded after the console was last used.
pub const RECORD_AFTER_USE: Duration = Duration::from_secs(30 * 60);

/// Now in µs since the epoch.
pub(crate) fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The last finished second before `now` (a second since the epoch), and the last second of
/// the last finished minute: where the charts end.
fn finished(now: u64) -> (u64, u64) {
    (now.saturating_sub(1), (now - now % 60).saturating_sub(1))
}

/// A counter key as a person reads it: the rule engine writes each part after its length
/// (`5:acme03:GET`); the parts are shown apart (`acme0 · GET`). A key not of that shape is
/// shown as it is (invalid UTF-8 replaced).
pub fn readable(key: &[u8]) -> String {
    let mut parts = Vec::new();
    let mut rest = key;
    while !rest.is_empty() {
        let Some(colon) = rest.iter().position(|&b| b == b':') else {
            return String::from_utf8_lossy(key).into_owned();
        };
        let Some(len) = std::str::from_utf8(&rest[..colon])
            .ok()
            .and_then(|n| n.parse::<usize>().ok())
        else {
            return String::from_utf8_lossy(key).into_owned();
        };
        let Some(part) = rest.get(colon + 1..colon + 1 + len) else {
            return String::from_utf8_lossy(key).into_owned();
        };
        parts.push(String::from_utf8_lossy(part).into_owned());
        rest = &rest[colon + 1 + len..];
    }
    parts.join(" · ")
}

/// What the console keeps: see the module documentation. Shared by every request; written
/// in shards (see [`shard`]).
#[derive(Debug)]
pub struct Console {
    /// The console's clock: the wall clock read once at the start (µs since the epoch), then
    /// advanced by the monotonic clock, so that timing a check also dates it.
    epoch: (std::time::Instant, u64),
    /// This instance's name among the instances of one Redis.
    pub instance: String,
    /// When this process started (seconds since the epoch).
    pub started: u64,
    shards: Box<[Shard]>,
    /// Until when requests are recorded for the preview (µs by the console's clock): 0 until
    /// the console is first used, then [`RECORD_AFTER_USE`] past its last use; `u64::MAX`
    /// when told to record always.
    record_until: AtomicU64,
    audit: Mutex<VecDeque<Audit>>,
    /// The other instances' summaries, as last read from Redis.
    peers: Mutex<Vec<instances::Summary>>,
    /// Set when the service shuts down: the summary is no longer published.
    retired: AtomicBool,
}

/// A rule's decisions, added up over the shards.
#[derive(Debug, Clone, Default)]
pub struct RuleView {
    /// Per second for the last two minutes, oldest first.
    pub seconds: Vec<series::Point>,
    /// Per minute for the last hour, oldest first.
    pub minutes: Vec<series::Point>,
    /// The hottest keys by hits and by denials.
    pub hits: Vec<top::Hot>,
    /// By denials.
    pub denials: Vec<top::Hot>,
}

/// A rule's recent decisions, added up over the shards.
#[derive(Debug, Clone, Copy, Default)]
pub struct Recent {
    /// Of the last 10 s.
    pub last10: series::Counts,
    /// Of the last 60 s.
    pub last60: series::Counts,
    /// The largest share of its limit a key used in the last 10 s (0 to 1).
    pub in_use: f64,
}

/// An admin action, as the audit log keeps it.
#[derive(Debug, Clone, Serialize)]
pub struct Audit {
    /// When (seconds since the epoch).
    pub at: u64,
    /// What: `reset`, `create`, `update`, `delete`.
    pub action: String,
    /// The rule.
    pub rule: String,
    /// The key, for a reset.
    pub key: Option<String>,
    /// Who: the client's address.
    pub by: String,
}

impl Console {
    /// A console whose recorders keep at most `record_bytes` in all, in one shard per core
    /// (at most [`MAX_SHARDS`]); recording requests `always`, or only while the console is in
    /// use (see [`Console::used`]).
    pub fn new(record_bytes: usize, always: bool) -> Self {
        let shards = std::thread::available_parallelism()
            .map_or(1, std::num::NonZero::get)
            .clamp(1, MAX_SHARDS);
        let epoch = (std::time::Instant::now(), now_micros());
        let started = epoch.1 / 1_000_000;
        Self {
            epoch,
            instance: instances::new_id(),
            started,
            shards: (0..shards)
                .map(|_| Shard::new(record_bytes / shards))
                .collect(),
            record_until: AtomicU64::new(if always { u64::MAX } else { 0 }),
            audit: Mutex::default(),
            peers: Mutex::default(),
            retired: AtomicBool::new(false),
        }
    }

    /// Now, by the console's clock (µs since the epoch).
    pub fn now(&self) -> u64 {
        self.at(std::time::Instant::now())
    }

    /// `instant` by the console's clock (µs since the epoch).
    pub fn at(&self, instant: std::time::Instant) -> u64 {
        let since = instant.saturating_duration_since(self.epoch.0);
        self.epoch.1 + since.as_secs() * 1_000_000 + u64::from(since.subsec_micros())
    }

    /// This thread's shard.
    fn shard(&self) -> &Shard {
        thread_local! {
            static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
        }
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let mut mine = MINE.get();
        if mine == usize::MAX {
            mine = NEXT.fetch_add(1, Ordering::Relaxed);
            MINE.set(mine);
        }
        &self.shards[mine % self.shards.len()]
    }

    /// Records a check that took `took`, started at `second` (since the epoch), and its
    /// decisions, each with its key.
    pub fn checked<'a>(
        &self,
        second: u64,
        took: Duration,
        decided: impl Iterator<Item = (&'a [u8], &'a Decision)>,
    ) {
        let mut shard = self.shard().lock();
        shard.latency.add(second, took);
        for (key, decision) in decided {
            shard.decided(second, key, decision);
        }
    }

    /// Marks the console used now: requests are recorded from now until
    /// [`RECORD_AFTER_USE`] past the last use.
    pub fn used(&self) {
        let until = self.now() + RECORD_AFTER_USE.as_micros() as u64;
        self.record_until.fetch_max(until, Ordering::Relaxed);
    }

    /// Keeps `request`, checked now, for the impact preview, while requests are recorded (see
    /// [`Console::used`]): encoded in a buffer of this thread, then copied into the shard's
    /// recorder under its lock. A console never used pays one load.
    pub fn arrived<H: Headers + ?Sized>(&self, request: &Request<'_, H>) {
        thread_local! {
            static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        let until = self.record_until.load(Ordering::Relaxed);
        if until == 0 {
            return;
        }
        let at = self.now();
        if at > until {
            return;
        }
        SCRATCH.with_borrow_mut(|record| {
            recorder::encode(record, at, request);
            self.shard().lock().recorder.push(record);
        });
    }

    /// The names of the rules that decided something.
    pub fn rules(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = Vec::new();
        for shard in &self.shards {
            names.extend(shard.lock().rules.values().map(|k| k.name));
        }
        names.sort_unstable();
        names.dedup();
        names
    }

    /// Each rule's recent decisions at `now` (a second since the epoch), by name.
    pub fn recent(&self, now: u64) -> HashMap<&'static str, Recent> {
        let mut all: HashMap<&'static str, Recent> = HashMap::new();
        for shard in &self.shards {
            for kept in shard.lock().rules.values() {
                let recent = all.entry(kept.name).or_default();
                recent.last10.add(&kept.series.last(now, 10));
                recent.last60.add(&kept.series.last(now, 60));
                recent.in_use = recent.in_use.max(kept.in_use(now));
            }
        }
        all
    }

    /// The rule named `name`'s decisions before `now` (a second since the epoch): per second
    /// up to the last finished one and per minute up to the last finished one, so that no
    /// chart's last point is a bucket still being counted; and its `n` hottest keys now.
    /// `None` when it decided nothing.
    pub fn rule(&self, name: &str, now: u64, n: usize) -> Option<RuleView> {
        let shards: Vec<_> = self.shards.iter().map(Shard::lock).collect();
        let kept: Vec<&Kept> = shards
            .iter()
            .flat_map(|s| s.rules.values().filter(|k| k.name == name))
            .collect();
        if kept.is_empty() {
            return None;
        }
        let (second, minute) = finished(now);
        let mut view = RuleView {
            seconds: Series::default().seconds(second),
            minutes: Series::default().minutes(minute),
            ..RuleView::default()
        };
        for k in &kept {
            add_points(&mut view.seconds, &k.series.seconds(second));
            add_points(&mut view.minutes, &k.series.minutes(minute));
        }
        let summaries: Vec<_> = kept.iter().flat_map(|k| k.hot.now(now)).collect();
        view.hits = top::merged(summaries.iter().map(|(h, _)| *h), n);
        view.denials = top::merged(summaries.iter().map(|(_, d)| *d), n);
        Some(view)
    }

    /// Every rule's decisions of each of the last [`series::SECONDS`] finished seconds before
    /// `now`, oldest first.
    pub fn seconds(&self, now: u64) -> Vec<series::Point> {
        let (second, _) = finished(now);
        let mut all = Series::default().seconds(second);
        for shard in &self.shards {
            for kept in shard.lock().rules.values() {
                add_points(&mut all, &kept.series.seconds(second));
            }
        }
        all
    }

    /// Every rule's decisions of the `span` seconds up to `now`.
    pub fn last(&self, now: u64, span: u64) -> series::Counts {
        let mut all = series::Counts::default();
        for shard in &self.shards {
            for kept in shard.lock().rules.values() {
                all.add(&kept.series.last(now, span));
            }
        }
        all
    }

    /// (p50, p99) of the checks of the `span` seconds up to `second`, in µs.
    pub fn latency(&self, second: u64, span: u64) -> (u64, u64) {
        let mut total = Histogram::default();
        for shard in &self.shards {
            shard.lock().latency.count(second, span, &mut total);
        }
        total.percentiles()
    }

    /// Whether requests are recorded now, and until when (µs since the epoch; `None`:
    /// always).
    pub fn recording(&self) -> (bool, Option<u64>) {
        let until = self.record_until.load(Ordering::Relaxed);
        (
            until != 0 && self.now() <= until,
            (until != u64::MAX).then_some(until),
        )
    }

    /// What the recorders hold, in all.
    pub fn recorded(&self) -> recorder::Held {
        let mut all = recorder::Held {
            requests: 0,
            bytes: 0,
            dropped: 0,
            oldest: None,
        };
        for shard in &self.shards {
            let held = shard.lock().recorder.held();
            all.requests += held.requests;
            all.bytes += held.bytes;
            all.dropped += held.dropped;
            all.oldest = match (all.oldest, held.oldest) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        all
    }

    /// The requests recorded at or after `since` (µs since the epoch), oldest first. Each
    /// shard's records are copied under its lock and read after.
    pub fn recorded_since(&self, since: u64) -> Vec<recorder::Recorded> {
        let copies: Vec<Vec<u8>> = self
            .shards
            .iter()
            .map(|s| s.lock().recorder.copy())
            .collect();
        let mut all: Vec<recorder::Recorded> = copies
            .iter()
            .flat_map(|copy| recorder::read(copy, since))
            .collect();
        all.sort_by_key(|r| r.at);
        all
    }

    /// Adds an admin action to the audit log (and to the service's log).
    pub fn audit(&self, entry: Audit) {
        tracing::info!(
            action = entry.action,
            rule = entry.rule,
            key = entry.key,
            by = entry.by,
            "console: admin action"
        );
        let mut audit = self.audit.lock().unwrap_or_else(|e| e.into_inner());
        if audit.len() == AUDIT {
            audit.pop_front();
        }
        audit.push_back(entry);
    }

    /// The audit log, newest first.
    pub fn audited(&self) -> Vec<Audit> {
        let audit = self.audit.lock().unwrap_or_else(|e| e.into_inner());
        audit.iter().rev().cloned().collect()
    }

    /// The other instances' summaries, as last read.
    pub fn peers(&self) -> Vec<instances::Summary> {
        self.peers.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops publishing this instance's summary (the service is shutting down).
    pub fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
    }

    /// Whether [`Console::retire`] was called.
    pub fn retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }

    pub(crate) fn set_peers(&self, peers: Vec<instances::Summary>) {
        *self.peers.lock().unwrap_or_else(|e| e.into_inner()) = peers;
    }
}

/// Adds `from` to `into`, point by point (both of the same seconds or minutes).
fn add_points(into: &mut [series::Point], from: &[series::Point]) {
    for (sum, point) in into.iter_mut().zip(from) {
        sum.counts.add(&point.counts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_part_by_part() {
        assert_eq!(readable(b"5:acme03:GET"), "acme0 · GET");
        assert_eq!(readable(b"plain key"), "plain key");
        assert_eq!(readable(b"9:short"), "9:short");
        assert_eq!(readable(b""), "");
    }

    /// Threads writing to their own shards add up, for readers, to what they did.
    #[test]
    fn what_threads_keep_in_their_shards_adds_up() {
        use tollgate::{Algorithm, Item, Limiter, ManualClock, Rule, Tier};
        let console = std::sync::Arc::new(Console::new(4 << 20, false));
        let request = Request {
            method: "GET",
            path: "/before",
            headers: &[][..],
            client_ip: None,
        };
        console.arrived(&request);
        assert_eq!(
            console.recorded().requests,
            0,
            "nothing recorded before a use"
        );
        console.used();
        let rule = Rule::new("api", Algorithm::FixedWindow, [Tier::per_minute(1_000)]).unwrap();
        let clock = ManualClock::at_micros(console.now());
        let limiter = std::sync::Arc::new(Limiter::builder(rule).clock(clock).build().unwrap());
        let second = console.now() / 1_000_000;
        std::thread::scope(|scope| {
            for thread in 0..4u64 {
                let (console, limiter) = (console.clone(), limiter.clone());
                scope.spawn(move || {
                    for i in 0..50u64 {
                        let key = if i % 2 == 0 {
                            b"hot".to_vec()
                        } else {
                            format!("k{thread}-{i}").into_bytes()
                        };
                        let decisions = limiter
                            .check_batch_now(&[Item::new("api", &key, 1)])
                            .unwrap();
                        let decided = std::iter::once(&key[..]).zip(decisions.iter());
                        console.checked(second, Duration::from_micros(10 + i), decided);
                        let path = format!("/v1/{thread}/{i}");
                        let request = Request {
                            method: "GET",
                            path: &path,
                            headers: &[][..],
                            client_ip: None,
                        };
                        console.arrived(&request);
                    }
                });
            }
        });
        assert_eq!(console.rules(), ["api"]);
        assert_eq!(console.last(second, 10).allowed, 200);
        let view = console.rule("api", second + 1, 3).unwrap();
        assert_eq!(
            view.seconds.iter().map(|p| p.counts.allowed).sum::<u64>(),
            200
        );
        assert_eq!(
            (view.hits[0].key.as_slice(), view.hits[0].count),
            (&b"hot"[..], 100)
        );
        assert_eq!(console.recent(second)["api"].last60.allowed, 200);
        let (p50, p99) = console.latency(second, 10);
        assert!((10..=63).contains(&p50) && p99 >= p50, "{p50} {p99}");
        let recorded = console.recorded_since(0);
        assert_eq!(recorded.len(), 200);
        assert!(
            recorded.windows(2).all(|w| w[0].at <= w[1].at),
            "oldest first"
        );
        assert_eq!(console.recorded().requests, 200);
        assert!(console.recorded().bytes <= 4 << 20);
        assert!(console.rule("other", second, 3).is_none());
    }

    #[test]
    fn charts_end_at_the_last_finished_second_and_minute() {
        let console = Console::new(1 << 20, false);
        let rule = tollgate::Rule::new(
            "api",
            tollgate::Algorithm::FixedWindow,
            [tollgate::Tier::per_minute(1000)],
        )
        .unwrap();
        let limiter = tollgate::Limiter::new(rule);
        // 90 s into a minute: this second and this minute are still being counted.
        let now = 1_800_000_000 / 60 * 60 + 90;
        for second in [now - 1, now] {
            let decisions = limiter
                .check_batch_now(&[tollgate::Item::new("api", b"k", 1)])
                .unwrap();
            console.checked(
                second,
                Duration::from_micros(5),
                std::iter::once(&b"k"[..]).zip(decisions.iter()),
            );
        }
        let view = console.rule("api", now, 3).unwrap();
        let last = view.seconds.last().unwrap();
        assert_eq!((last.at, last.counts.allowed), (now - 1, 1));
        assert_eq!(
            view.seconds.iter().map(|p| p.counts.allowed).sum::<u64>(),
            1
        );
        assert_eq!(view.minutes.last().unwrap().at, now - now % 60 - 60);
        assert_eq!(console.seconds(now).last().unwrap().at, now - 1);
    }
}
