//! What a rule is on Redis, prepared once when it is planned: its function, its keys' names
//! and its tiers' arguments.

use std::borrow::Cow;
use std::io::Write as _;

use super::args::tier_args;
use super::keys::{by_slot, slot, tagged};
use super::script::{self, Entry};
use crate::layout::{self, DOUBLE, Kept, packed, tier};
use crate::rule::Rule;
use crate::store::Planned;
use crate::store::guard::{GuardPlan, Guarded};

/// What a rule is on Redis: its function, key names and tier arguments, prepared once.
#[derive(Debug, Clone)]
pub struct RedisPlan {
    pub(super) entry: &'static Entry,
    /// The algorithm's index, as the batch function names it.
    pub(super) algorithm: usize,
    /// Whether the algorithm gives back a take exactly (see [`across`]).
    pub(super) gives_back: bool,
    /// `tg:<rule>:<fingerprint>:`
    pub(super) prefix: Vec<u8>,
    pub(super) tiers: usize,
    /// ARGV[2]: each tier's arguments (see `layout::tier`).
    pub(super) tier_args: Vec<u8>,
    /// Whether a tier has a calendar period, whose boundaries go in its arguments at each call.
    pub(super) calendar: bool,
    pub(super) guard: GuardPlan,
    /// The rule argument of `TOLLGATE.CHECK` ([`crate::inside::rule_args`]), when its checks
    /// call the module where a node has it.
    pub(super) module: Option<Vec<u8>>,
}

impl Guarded for RedisPlan {
    fn guard(&self) -> &GuardPlan {
        &self.guard
    }
}

impl RedisPlan {
    pub(super) fn new(rule: &Rule, key_prefix: &[u8], guard: GuardPlan, module: bool) -> Self {
        let algorithm = rule.algorithm();
        let entry = script::entry(algorithm);
        let name = format!("tg:{}:{:08x}:", rule.name(), rule.fingerprint());
        Self {
            entry,
            algorithm: layout::index(algorithm),
            gives_back: algorithm.gives_back(),
            prefix: [key_prefix, name.as_bytes()].concat(),
            tiers: rule.tiers().len(),
            tier_args: tier_args(rule),
            calendar: rule.tiers().iter().any(|t| t.calendar_period().is_some()),
            guard,
            module: (module && layout::kept(algorithm) == Kept::Words)
                .then(|| crate::inside::rule_args(algorithm)),
        }
    }

    /// The tiers' arguments for a call at `now` (µs): with each calendar tier's boundaries
    /// around `now` as its parameters (see `window_of` in `lua/prelude.lua`).
    pub(super) fn tier_args_at(&self, rule: &Rule, now: u64) -> Cow<'_, [u8]> {
        if !self.calendar {
            return Cow::Borrowed(&self.tier_args);
        }
        let mut args = self.tier_args.clone();
        for (i, tier) in rule.tiers().iter().enumerate() {
            if let Some(calendar) = tier.calendar_period() {
                let [b0, b1, b2, b3] = calendar.bounds(now);
                let parameters = packed([b0 as f64, b1 as f64, b2 as f64, b3 as f64, 1.0]);
                let at = tier::BYTES * i + DOUBLE * tier::PARAMETERS;
                args[at..at + parameters.len()].copy_from_slice(&parameters);
            }
        }
        Cow::Owned(args)
    }

    /// The Redis key of `key`'s state, or the part its tiers' keys share when each tier has
    /// its own: `<prefix>tg:<rule>:<fingerprint>:<key length>:{k<key>}`.
    pub(super) fn name(&self, key: &[u8]) -> Vec<u8> {
        // Room for a tier's suffix.
        tagged(&self.prefix, key, 8)
    }

    /// The Redis keys that hold `key`'s state, all with the same hash tag.
    pub fn keys(&self, key: &[u8]) -> Vec<Vec<u8>> {
        let base = self.name(key);
        if !self.entry.key_per_tier {
            return vec![base];
        }
        (0..self.tiers)
            .map(|i| {
                let mut name = base.clone();
                let _ = write!(name, ":{i}");
                name
            })
            .collect()
    }
}

/// The items of a batch by Redis Cluster slot, in the order their slots first appear.
pub(super) fn slot_groups(items: &[Planned<'_, RedisPlan>]) -> Vec<Vec<usize>> {
    by_slot(items.iter().map(|item| slot(&item.plan.keys(item.key)[0])))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::{Algorithm, Tier};

    #[test]
    fn every_key_of_a_check_shares_one_hash_tag() {
        let rule = Rule::new(
            "api",
            Algorithm::SlidingLog,
            [Tier::per_second(5), Tier::per_minute(50)],
        )
        .unwrap();
        let plan = RedisPlan::new(&rule, b"", GuardPlan::none(), true);
        for key in [&b"tenant-1"[..], b"", b"}{weird}", b"\xff\x00"] {
            let keys = plan.keys(key);
            assert_eq!(keys.len(), 2);
            let slots: Vec<u16> = keys.iter().map(|k| slot(k)).collect();
            assert_eq!(slots[0], slots[1], "{key:?}");
        }
        let name = String::from_utf8(plan.keys(b"tenant-1")[1].clone()).unwrap();
        assert_eq!(
            name,
            format!("tg:api:{:08x}:8:{{ktenant-1}}:1", rule.fingerprint())
        );
    }

    #[test]
    fn one_key_per_rule_for_word_algorithms() {
        let rule = Rule::new(
            "api",
            Algorithm::Gcra,
            [Tier::per_second(5), Tier::per_minute(9)],
        )
        .unwrap();
        assert_eq!(
            RedisPlan::new(&rule, b"", GuardPlan::none(), true)
                .keys(b"k")
                .len(),
            1
        );
    }

    #[test]
    fn tier_arguments_carry_exact_doubles() {
        let rule = Rule::new(
            "api",
            Algorithm::WarmUp(crate::WarmUp::new(Duration::from_secs(2))),
            [Tier::per_second(3)],
        )
        .unwrap();
        let plan = RedisPlan::new(&rule, b"", GuardPlan::none(), true);
        assert_eq!(plan.tier_args.len(), tier::BYTES);
        let double =
            |i: usize| f64::from_le_bytes(plan.tier_args[8 * i..8 * i + 8].try_into().unwrap());
        assert_eq!(double(0), 3.0);
        assert_eq!(double(6), 1_000_000.0 / 3.0);
    }
}
