//! Allow and deny lists, checked before the rules, and bans (a rule's `ban`), which are deny
//! entries a denial writes. Each instance keeps every entry in memory, so that a check looks
//! its keys up without asking any store; edits are written to Redis (a Redis store: every
//! instance reads them within a second) or to `server.lists_file` (the memory store).

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tollgate::{Decision, Decisions, Item};

use super::{EditError, Loaded, Service};
use crate::config::{ListEntry, ListKind, MAX_LIST_ENTRIES};
use crate::metrics;

/// Every entry, by rule (or `*`) and key: one of each list at most.
#[derive(Debug, Default)]
pub struct Lists {
    entries: RwLock<HashMap<String, HashMap<String, Pair>>>,
    /// Whether there is any entry: a check of a service with none looks nothing up.
    any: AtomicBool,
    /// The version of the shared lists last read.
    version: AtomicU64,
}

/// A rule's key's entries: on the allow list, the deny list, or both (deny wins).
#[derive(Debug, Default, Clone)]
struct Pair {
    allow: Option<ListEntry>,
    deny: Option<ListEntry>,
}

/// What the lists say of a check's items.
pub(super) enum Screened<'a> {
    /// Some item is denied: the check is refused with these decisions (403 when `forbidden`).
    Denied {
        decisions: Decisions,
        forbidden: bool,
    },
    /// The items to check (those on no list), and the decisions of those allowed, each with
    /// its item's place among the items given.
    Check(Vec<Item<'a>>, Vec<(usize, Decision)>),
}

/// Milliseconds since the epoch.
pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The rule a check's item counts for: an override's derived rule answers for its rule.
fn base(rule: &str) -> &str {
    rule.split_once('/').map_or(rule, |(base, _)| base)
}

impl Lists {
    /// Lists holding `entries`.
    pub(super) fn new(entries: Vec<ListEntry>) -> Self {
        let lists = Self::default();
        lists.replace(entries);
        lists
    }

    /// The version of the shared lists these hold.
    pub(super) fn set_version(&self, version: u64) {
        self.version.store(version, Ordering::Relaxed);
    }

    /// Every entry in force, in a stable order.
    pub fn entries(&self) -> Vec<ListEntry> {
        let now = now_ms();
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<ListEntry> = entries
            .values()
            .flat_map(HashMap::values)
            .flat_map(|p| [&p.allow, &p.deny])
            .flatten()
            .filter(|e| !e.expired(now))
            .cloned()
            .collect();
        all.sort_by(|a, b| (a.list, &a.rule, &a.key).cmp(&(b.list, &b.rule, &b.key)));
        all
    }

    /// Whether `rule`'s `key` is on `list` now.
    pub fn holds(&self, list: ListKind, rule: &str, key: &str) -> bool {
        let now = now_ms();
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let pair = entries.get(rule).and_then(|keys| keys.get(key));
        let entry = pair.and_then(|p| match list {
            ListKind::Allow => p.allow.as_ref(),
            ListKind::Deny => p.deny.as_ref(),
        });
        entry.is_some_and(|e| !e.expired(now))
    }

    /// Replaces every entry with `entries`.
    fn replace(&self, entries: Vec<ListEntry>) {
        let mut map: HashMap<String, HashMap<String, Pair>> = HashMap::new();
        let now = now_ms();
        for entry in entries.into_iter().filter(|e| !e.expired(now)) {
            let pair = map
                .entry(entry.rule.clone())
                .or_default()
                .entry(entry.key.clone())
                .or_default();
            match entry.list {
                ListKind::Allow => pair.allow = Some(entry),
                ListKind::Deny => pair.deny = Some(entry),
            }
        }
        self.any.store(!map.is_empty(), Ordering::Relaxed);
        *self.entries.write().unwrap_or_else(|e| e.into_inner()) = map;
        self.gauge();
    }

    /// Puts `entry` in (or takes its list's entry of its rule and key out, when `keep` is
    /// false). Returns whether one was there.
    fn set(&self, entry: &ListEntry, keep: bool) -> bool {
        let mut map = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let pair = map
            .entry(entry.rule.clone())
            .or_default()
            .entry(entry.key.clone())
            .or_default();
        let slot = match entry.list {
            ListKind::Allow => &mut pair.allow,
            ListKind::Deny => &mut pair.deny,
        };
        let was = slot.take().is_some_and(|e| !e.expired(now_ms()));
        if keep {
            *slot = Some(entry.clone());
        }
        if let Some(keys) = map.get_mut(&entry.rule) {
            keys.retain(|_, p| p.allow.is_some() || p.deny.is_some());
            if keys.is_empty() {
                map.remove(&entry.rule);
            }
        }
        self.any.store(!map.is_empty(), Ordering::Relaxed);
        drop(map);
        self.gauge();
        was
    }

    /// How many entries there are, expired ones included until they are swept.
    fn len(&self) -> usize {
        let map = self.entries.read().unwrap_or_else(|e| e.into_inner());
        map.values().map(HashMap::len).sum()
    }

    fn gauge(&self) {
        let map = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let mut counts = [0usize; 2];
        for pair in map.values().flat_map(HashMap::values) {
            counts[0] += usize::from(pair.allow.is_some());
            counts[1] += usize::from(pair.deny.is_some());
        }
        metrics::list_entries(ListKind::Allow.name(), counts[0]);
        metrics::list_entries(ListKind::Deny.name(), counts[1]);
    }

    /// The entry in force of `rule`'s `key` (the rule's own first, then `*`'s): a deny entry
    /// before an allow entry.
    fn find(&self, rule: &str, key: &str, now: u64) -> Option<ListEntry> {
        let map = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let pairs = [rule, "*"].map(|r| map.get(r).and_then(|keys| keys.get(key)));
        let live = |e: &Option<ListEntry>| e.as_ref().filter(|e| !e.expired(now)).cloned();
        pairs
            .iter()
            .flatten()
            .find_map(|p| live(&p.deny))
            .or_else(|| pairs.iter().flatten().find_map(|p| live(&p.allow)))
    }

    /// What the lists say of `items`, under the rules of `loaded`; `None` when no item is on
    /// any list (or there are no entries).
    pub(super) fn screen<'a>(&self, loaded: &Loaded, items: &[Item<'a>]) -> Option<Screened<'a>> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let limiter = loaded.limiter.as_ref()?;
        let now = now_ms();
        let mut found = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let key = crate::console::readable(item.key);
            if let Some(entry) = self.find(base(item.rule), &key, now) {
                found.push((i, entry));
            }
        }
        if found.is_empty() {
            return None;
        }
        let rule_of = |name: &str| limiter.rules().find(|r| r.name() == name);
        let denied: Vec<&(usize, ListEntry)> = found
            .iter()
            .filter(|(_, e)| e.list == ListKind::Deny)
            .collect();
        if !denied.is_empty() {
            let mut forbidden = false;
            let decisions: Decisions = denied
                .iter()
                .filter_map(|(i, entry)| {
                    forbidden |= entry.status == Some(403);
                    metrics::listed(ListKind::Deny.name(), base(items[*i].rule));
                    // Until the entry ends; an entry without an end asks for an hour.
                    let wait = entry
                        .expires_at_ms
                        .map_or(Duration::from_secs(3_600), |at| {
                            Duration::from_millis(at.saturating_sub(now).max(1))
                        });
                    rule_of(items[*i].rule).map(|r| r.listed(Some(wait)))
                })
                .collect();
            return Some(Screened::Denied {
                decisions,
                forbidden,
            });
        }
        let mut waved = Vec::new();
        let mut kept = Vec::with_capacity(items.len());
        let mut found = found.into_iter().peekable();
        for (i, item) in items.iter().enumerate() {
            if found.peek().is_some_and(|(at, _)| *at == i) {
                found.next();
                metrics::listed(ListKind::Allow.name(), base(item.rule));
                if let Some(rule) = rule_of(item.rule) {
                    waved.push((i, rule.listed(None)));
                }
            } else {
                kept.push(*item);
            }
        }
        Some(Screened::Check(kept, waved))
    }
}

impl Service {
    /// The allow and deny lists.
    pub fn lists(&self) -> &Lists {
        &self.lists
    }

    /// Puts `entry` on its list (`keep`), or takes its list's entry of its rule and key off:
    /// kept in Redis for every instance on a Redis store, in `server.lists_file` on the
    /// memory store. Returns whether one was there.
    ///
    /// # Errors
    /// [`EditError::Invalid`] for an unknown rule, an empty key, a bad status, or lists that
    /// hold their most entries; [`EditError::Unavailable`] when Redis or the file did not take
    /// it: nothing changed.
    pub async fn set_list_entry(&self, entry: ListEntry, keep: bool) -> Result<bool, EditError> {
        let _one_at_a_time = self.edits.lock().await;
        let loaded = self.loaded();
        if entry.rule != "*" && !loaded.engine.rules().any(|r| r.name() == entry.rule) {
            return Err(EditError::Invalid(format!(
                "no rule `{}`: name a rule, or `*` for every rule",
                entry.rule
            )));
        }
        if entry.key.is_empty() {
            return Err(EditError::Invalid("the key is empty".into()));
        }
        match (entry.list, entry.status) {
            (_, None) | (ListKind::Deny, Some(403 | 429)) => {}
            (ListKind::Allow, Some(_)) => {
                return Err(EditError::Invalid("status: is for deny entries".into()));
            }
            (ListKind::Deny, Some(other)) => {
                return Err(EditError::Invalid(format!(
                    "status: {other}: a denied key answers 429 or 403"
                )));
            }
        }
        if keep && self.lists.len() >= MAX_LIST_ENTRIES {
            return Err(EditError::Invalid(format!(
                "the lists hold {MAX_LIST_ENTRIES} entries, the most kept: delete some"
            )));
        }
        if let Some(shared) = &self.shared {
            let version = shared
                .write_lists(&[(&entry, keep)])
                .await
                .map_err(|e| EditError::Unavailable(e.to_string()))?;
            self.lists.version.store(version, Ordering::Relaxed);
        } else if let Some(file) = &loaded.config.server.lists_file {
            // The file first: when it does not take the edit, nothing changes.
            let same =
                |e: &ListEntry| (e.list, &e.rule, &e.key) == (entry.list, &entry.rule, &entry.key);
            let mut kept: Vec<ListEntry> = self
                .lists
                .entries()
                .into_iter()
                .filter(|e| e.reason.as_deref() != Some("ban") && !same(e))
                .collect();
            if keep {
                kept.push(entry.clone());
            }
            write_file(file, &kept).map_err(|e| {
                EditError::Unavailable(format!("cannot keep the lists in {}: {e}", file.display()))
            })?;
        }
        let was = self.lists.set(&entry, keep);
        Ok(was)
    }

    /// Bans the keys of `items` whose decisions `decisions` deny under a rule with a ban:
    /// each is put on the deny list for the ban's length (shared through Redis, where there
    /// is one), and its decision says so (denied until the ban ends).
    pub(super) async fn ban(&self, loaded: &Loaded, items: &[Item<'_>], decisions: &mut Decisions) {
        if loaded.bans.is_empty() {
            return;
        }
        let mut banned = Vec::new();
        for (item, decision) in items.iter().zip(decisions.iter_mut()) {
            if decision.allowed() {
                continue;
            }
            let Some((rule, length)) = loaded.bans.get(decision.rule()).and_then(|ban| {
                let rule = loaded
                    .limiter
                    .as_ref()?
                    .rules()
                    .find(|r| r.name() == decision.rule())?;
                Some((rule, *ban))
            }) else {
                continue;
            };
            let entry = ListEntry {
                list: ListKind::Deny,
                rule: decision.rule().to_string(),
                key: crate::console::readable(item.key),
                expires_at_ms: Some(
                    now_ms() + u64::try_from(length.as_millis()).unwrap_or(u64::MAX),
                ),
                status: None,
                reason: Some("ban".into()),
            };
            if self.lists.len() >= MAX_LIST_ENTRIES {
                metrics::ban(decision.rule(), "refused");
                tracing::warn!(rule = decision.rule(), key = %entry.key, "the lists are full: this key is not banned");
                continue;
            }
            *decision = rule.listed(Some(length));
            self.lists.set(&entry, true);
            metrics::ban(decision.rule(), "banned");
            banned.push(entry);
        }
        if let (Some(shared), false) = (&self.shared, banned.is_empty()) {
            let writes: Vec<(&ListEntry, bool)> = banned.iter().map(|e| (e, true)).collect();
            match shared.write_lists(&writes).await {
                Ok(version) => self.lists.version.store(version, Ordering::Relaxed),
                Err(e) => {
                    tracing::warn!(error = %e, "bans not shared: they hold on this instance only")
                }
            }
        }
    }

    /// Reads the shared lists when another instance changed them, dropping what expired;
    /// called every [`POLL`](crate::shared::POLL).
    pub(super) async fn refresh_lists(&self, shared: &crate::shared::SharedRules) {
        let version = match shared.lists_version().await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the shared lists' version");
                return;
            }
        };
        if version == self.lists.version.load(Ordering::Relaxed) {
            return;
        }
        match shared.read_lists().await {
            Ok((version, entries)) => {
                let now = now_ms();
                let (live, expired): (Vec<ListEntry>, Vec<ListEntry>) =
                    entries.into_iter().partition(|e| !e.expired(now));
                self.lists.replace(live);
                self.lists.version.store(version, Ordering::Relaxed);
                if !expired.is_empty() {
                    // Swept by whoever reads them first; a sweep moves the version, once.
                    let gone: Vec<(&ListEntry, bool)> =
                        expired.iter().map(|e| (e, false)).collect();
                    if let Ok(version) = shared.write_lists(&gone).await {
                        self.lists.version.store(version, Ordering::Relaxed);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the shared lists"),
        }
    }
}

/// The lists kept in `file`, none when it does not exist yet.
///
/// # Errors
/// A file that cannot be read, or is not a list of entries.
pub(super) fn read_file(file: &std::path::Path) -> anyhow::Result<Vec<ListEntry>> {
    match std::fs::read(file) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| anyhow::anyhow!("{}: not a list of entries: {e}", file.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(anyhow::anyhow!("{}: {e}", file.display())),
    }
}

/// Writes `entries` to `file` whole: a file beside it, then renamed over it.
fn write_file(file: &std::path::Path, entries: &[ListEntry]) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(entries)?;
    let mut partial = file.as_os_str().to_owned();
    partial.push(".partial");
    std::fs::write(&partial, json)?;
    std::fs::rename(&partial, file)
}
