//! The answers the handlers write by hand, as types: the OpenAPI document describes them
//! (`openapi.rs`), and `tests/integration/openapi.rs` checks real answers against them.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// The answer to a check: whether the request is admitted (every rule admits), and each
/// rule's decision.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"allowed": true, "decisions": [{"rule": "get-product", "allowed": true, "limit": 1000, "remaining": 999, "reset_after_ms": 9512, "window_s": 10, "shadowed": false, "source": "memory"}]}))]
pub struct CheckAnswer {
    /// When a concurrency rule admitted: the permit its slots are held under, to release
    /// (`POST /v1/release`) when the work is done, or extend (`POST /v1/extend`) while it goes
    /// on. Also in the `Tollgate-Permit` header field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permit: Option<String>,
    /// With `permit`: milliseconds until it ends unless extended (its slots free themselves
    /// then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permit_expires_in_ms: Option<u64>,
    /// Whether the request is admitted: every decision admits. A denied check consumed
    /// nothing, in any rule.
    pub allowed: bool,
    /// One decision per rule that applied, in order.
    pub decisions: Vec<DecisionView>,
    /// When a global rule decided: the region that answered (this instance's, as its
    /// store's `regions.region` names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// One rule's decision, by its binding tier (the one that denied with the longest wait, or,
/// when every tier admitted, the one with the least left).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionView {
    /// The rule's id.
    pub rule: String,
    /// Whether this rule admits.
    pub allowed: bool,
    /// The binding tier's capacity: its limit, or a bucket's burst.
    pub limit: u64,
    /// What the binding tier would still admit now.
    pub remaining: u64,
    /// Milliseconds, rounded up, until the binding tier is back to its full allowance if
    /// nothing else arrives.
    pub reset_after_ms: u64,
    /// When denied: milliseconds, rounded up, until the same request would be admitted;
    /// never early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The binding tier's window in whole seconds, rounded up.
    pub window_s: u64,
    /// A rule in shadow mode would have denied: admitted anyway.
    pub shadowed: bool,
    /// What decided.
    pub source: DecisionSource,
}

/// What decided: the store, a list, or, when a shared store failed, the rule's failure
/// policy.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecisionSource {
    /// The memory store.
    Memory,
    /// Redis, in one atomic round trip.
    Redis,
    /// Redis, in one atomic round trip, decided by tollgate's Redis module rather than its
    /// Lua functions (`TOLLGATE.CHECK`): the same decision on the same keys.
    RedisModule,
    /// The hybrid store's counts.
    Hybrid,
    /// The lease store's leases.
    Lease,
    /// A global rule: every region's counts as this region's Redis holds them, each peer
    /// region heard within the rule's `stale_after`.
    Global,
    /// A global rule while a peer region is unheard past its `stale_after`: this region
    /// admitted at most its share of what was left (or, with `on_partition: region`, all of
    /// it).
    Partitioned,
    /// The local share of the limit (`on_failure: local:SHARE`), while Redis failed.
    Fallback,
    /// Admitted uncounted (`on_failure: open`), while Redis failed.
    FailOpen,
    /// Denied (`on_failure: closed`), while Redis failed.
    FailClosed,
    /// An allow or deny list entry, or a ban: decided before the store, counting nothing.
    List,
    /// A denial Redis gave, answered again by this instance until its `retry_after`
    /// (`server.denied_cache_bytes`).
    Cache,
    /// A path added after this version.
    Other,
}

/// A reservation: its id to settle it by (null when denied: nothing was taken; or when a
/// failure policy admitted it while the store failed: nothing was counted), how long it lives
/// unsettled, and the decisions of its estimate.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReservationAnswer {
    /// The id: 32 hex digits.
    pub id: Option<String>,
    /// Milliseconds until it settles by itself, as its rules say.
    #[serde(default)]
    pub expires_in_ms: Option<u64>,
    /// Whether the estimate was admitted.
    pub allowed: bool,
    /// One decision per rule that applied.
    pub decisions: Vec<DecisionView>,
}

/// What is wrong with a request.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"error": "unknown rule `nope`"}))]
pub struct ErrorBody {
    /// What is wrong, in words.
    pub error: String,
}

/// A check's 403: what is wrong (a stated limit no rule takes), or, for a key on a deny list
/// whose entry answers 403, a check's answer (decisions of source `list`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Forbidden {
    /// A `limit` stated, and no rule the check applies to takes one.
    Refused(ErrorBody),
    /// A key on a deny list whose entry answers 403.
    Denied(CheckAnswer),
}

/// What is wrong with a rule, at the line and column of the field at fault in the text sent.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"error": "rule `tight`: tiers[0].limit: must be at least 1", "line": 4, "column": 19}))]
pub struct PlacedError {
    /// What is wrong.
    pub error: String,
    /// The line (from 1).
    pub line: u64,
    /// The column (from 1).
    pub column: u64,
}

/// Every override in force.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OverrideList {
    /// Each, by rule and key.
    pub overrides: Vec<crate::config::OverrideEntry>,
}

/// The native rules, as written.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleList {
    /// Every native rule: from the files, and created through this API.
    pub rules: Vec<crate::config::RuleSpec>,
}

/// The console's overview.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Overview {
    /// This instance's name among the instances of one Redis.
    pub instance: String,
    /// tollgate's version.
    pub version: String,
    /// When this instance started (seconds since the epoch).
    pub started: u64,
    /// Now (seconds since the epoch).
    pub now: u64,
    /// Decisions per second over the last 10 s: `allowed`, `denied`, `shadow`.
    #[schema(value_type = Object)]
    pub rate: Value,
    /// Check latency over the last minute: `p50_us`, `p99_us`.
    #[schema(value_type = Object)]
    pub latency: Value,
    /// Decisions per second for two minutes, oldest first.
    #[schema(value_type = Vec<Object>)]
    pub seconds: Vec<Value>,
    /// The store: `kind`, and its health (keys and bytes held; on Redis, a `PING`'s round
    /// trip, whether it is `down` or `degraded`, its `nodes`).
    #[schema(value_type = Object)]
    pub store: Value,
    /// The rule files served.
    pub files: Vec<String>,
    /// How the rule files loaded: `version`, `loaded_at`, `last_error`.
    #[schema(value_type = Object)]
    pub status: Value,
    /// The instances on the same Redis (this one alone on the memory store).
    #[schema(value_type = Vec<Object>)]
    pub instances: Vec<Value>,
    /// What the recorder holds for the impact preview.
    #[schema(value_type = Object)]
    pub recorder: Value,
}

/// Every rule (native and Envoy's) with what it does and how busy it is.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsoleRules {
    /// Each rule: `id`, `source` (file, admin, envoy), `algorithm`, `tiers`, `shadow`,
    /// `on_failure`, `store`, `enabled`, `match`, `key`, its `rate` (per second over 10 s),
    /// `denied_per_minute`, `shadow_per_minute`, `in_use` (the largest share of its limit a
    /// key uses), `all_instances_per_minute`.
    #[schema(value_type = Vec<Object>)]
    pub rules: Vec<Value>,
}

/// One rule, its recent decisions and its hottest keys.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsoleRule {
    /// What the rule is (as in the list).
    #[schema(value_type = Object)]
    pub rule: Value,
    /// The rule as written, when it is native.
    #[schema(value_type = Option<Object>)]
    pub spec: Option<Value>,
    /// The same, in YAML.
    pub yaml: Option<String>,
    /// Decisions per second for two minutes.
    #[schema(value_type = Vec<Object>)]
    pub seconds: Vec<Value>,
    /// Decisions per minute for an hour.
    #[schema(value_type = Vec<Object>)]
    pub minutes: Vec<Value>,
    /// The hottest keys `hits` and `denials`, each with what it has left now, and for a
    /// global rule `regions`: what each region admitted of it in this window.
    #[schema(value_type = Object)]
    pub hot: Value,
}

/// A rule that would be taken.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Validated {
    /// The rule, as the admin API would keep it.
    pub rule: crate::config::RuleSpec,
    /// The same, in YAML.
    pub yaml: Option<String>,
}

/// The requests recorded lately, replayed through a proposed rule and through the rule of
/// that id in use now.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewAnswer {
    /// What the proposed rule would have done: requests matched, denied, which keys, offered
    /// against admitted over time.
    #[schema(value_type = Object)]
    pub proposed: Value,
    /// The same for the rule in use, when one has that id.
    #[schema(value_type = Option<Object>)]
    pub current: Option<Value>,
}

/// What a check would get, consuming nothing.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Explained {
    /// The rules that match, each with its key, state and what it would say.
    #[schema(value_type = Vec<Object>)]
    pub matches: Vec<Value>,
    /// The cost explained.
    #[serde(default)]
    pub cost: Option<u64>,
    /// Whether the check would be admitted.
    pub allowed: bool,
    /// The status the caller would get.
    #[serde(default)]
    pub status: Option<u16>,
    /// The rate limit header fields the caller would get.
    #[schema(value_type = Object)]
    pub headers: Value,
}

/// The admin actions taken through this instance, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditLog {
    /// Each: `at` (seconds since the epoch), `action`, `rule`, `key`, `by` (the client's
    /// address), `display`.
    #[schema(value_type = Vec<Object>)]
    pub audit: Vec<Value>,
}

/// This region and its peers.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegionsAnswer {
    /// This region's name.
    pub region: String,
    /// Each peer region as this instance hears it.
    pub peers: Vec<PeerView>,
    /// With `rule` and `key`: per tier, what each region admitted of the key in the current
    /// window, net of what it gave back (a sliding window's previous window weighted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Vec<Vec<RegionUse>>>,
}

/// A peer region's health.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PeerView {
    /// Its name.
    pub name: String,
    /// Whether its Redis answered this instance's last round.
    pub up: bool,
    /// Milliseconds since it last answered; absent: never since start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heard_ms: Option<u64>,
    /// How long its last answer took (ms): about the round trip between the regions.
    pub lag_ms: u64,
    /// Rounds it did not take.
    pub failures: u64,
    /// Buckets of this region's counts it has not taken yet.
    pub pending: usize,
}

/// One region's use of a key under a tier.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegionUse {
    /// The region.
    pub region: String,
    /// Permits admitted there, net of those given back.
    pub admitted: u64,
}
