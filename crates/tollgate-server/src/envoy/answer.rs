//! The answer to an Envoy request, as the Envoy ratelimit service gives it: every
//! descriptor counts its hits whatever the others' outcome (or, with
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, only those over their limit count once one is),
//! a descriptor may carry its own limit, the request's verdict follows shadow and quota
//! modes, and descriptors known to be over their limit are answered from a local cache
//! ([`OverCache`]) until their window ends. Composed of the service's checks; the gRPC
//! service, `POST /json` and `/v1/check` with descriptors all ask it.

use std::sync::Arc;

use tollgate::Decision;
use tollgate::engine::{Descriptor, DescriptorHit, Domain, LimitOverride, NodeLimit};

use super::over_cache::{self, OverCache};
use crate::config::EnvoySettings;
use crate::metrics::{EnvoyStats, Hits};
use crate::service::{CheckError, Service};

/// Descriptors checked at once, each on its own: sent together, Redis gets them in one write
/// (Envoy sends a few per request).
const CHECKS_AT_ONCE: usize = 32;

/// Envoy's answers over the service: see the module documentation. Cheap to share behind an
/// `Arc`.
#[derive(Debug)]
pub struct Envoy {
    service: Arc<Service>,
    /// Envoy descriptors over their limit, answered without the store until their window
    /// ends (`LOCAL_CACHE_SIZE_IN_BYTES`, read at start).
    over_cache: Option<OverCache>,
}

impl Envoy {
    /// Envoy's answers over `service`, with the local cache its settings ask for.
    pub fn new(service: Arc<Service>) -> Self {
        let cache_bytes = service.loaded().config.server.envoy.local_cache_bytes;
        Self {
            service,
            over_cache: (cache_bytes > 0).then(|| OverCache::new(cache_bytes)),
        }
    }

    /// The service this answers over.
    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    /// Takes the hits of `descriptors` off their counters: Envoy's negative hits
    /// (`is_negative_hits`, sent when a stream is done, for the hits its request took). Each
    /// counter goes down by the descriptor's hits, floored at 0, in the window counting now;
    /// the answer is never over the limit, and says what the limit has left after. A limit of
    /// 0 per unit, `unlimited` or no limit has nothing to give back: OK. The local cache of
    /// descriptors over their limit forgets each one. Counted in
    /// `tollgate_envoy_negative_hits_total`, not in the hits' statistics.
    ///
    /// # Errors
    /// [`CheckError::Unsupported`] on a store that takes no give-backs (hybrid, lease);
    /// [`CheckError::Unavailable`] when Redis did not take it.
    pub async fn give_back(
        &self,
        domain: &str,
        descriptors: &[(Descriptor, u64, Option<LimitOverride>)],
    ) -> Result<Vec<DescriptorOutcome>, CheckError> {
        let loaded = self.service.loaded();
        let (Some(found), Some(limiter)) = (loaded.engine.domain(domain), &loaded.limiter) else {
            return Ok(vec![DescriptorOutcome::None; descriptors.len()]);
        };
        let hits = found.hits(descriptors.iter().map(|(d, _, limit)| (d, *limit)));
        let now = over_cache::now_micros();
        let mut outcomes = Vec::with_capacity(hits.len());
        for (hit, (_, cost, _)) in hits.into_iter().zip(descriptors) {
            let outcome = match hit {
                DescriptorHit::Limited {
                    mut hit,
                    limit,
                    stats,
                    ..
                } => {
                    if hit.key.len() > tollgate::MAX_KEY_LEN {
                        hit.key = digested(&hit.key);
                    }
                    let credit = tollgate::Settle::Credit { at: now };
                    let decisions = limiter.settle_batch(&[hit.item(*cost)], credit).await?;
                    if let Some(cache) = &self.over_cache {
                        cache.forget(hit.rule, &hit.key, limit.unit.1, now);
                    }
                    crate::metrics::negative_hits(&stats, *cost);
                    let decision = decisions[0];
                    DescriptorOutcome::Checked {
                        limit: limit.into_owned(),
                        decision,
                        over: false,
                        remaining: decision.remaining(),
                    }
                }
                DescriptorHit::None | DescriptorHit::Blocked { .. } => DescriptorOutcome::None,
                DescriptorHit::Unlimited(_) => DescriptorOutcome::Unlimited,
            };
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    /// Checks Envoy descriptors of `domain`, each with its cost and the limit it carries if
    /// any, as the Envoy ratelimit service counts: every descriptor counts its hits, over its
    /// limit or not, whatever the others' outcome. With `stop_when_over` (its
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`), when one is over, only the descriptors
    /// over their limit count.
    ///
    /// # Errors
    /// [`CheckError`] for a bad cost or key.
    pub async fn check_descriptors(
        &self,
        domain: &str,
        descriptors: &[(Descriptor, u64, Option<LimitOverride>)],
    ) -> Result<EnvoyAnswer, CheckError> {
        let loaded = self.service.loaded();
        let Some(found) = loaded.engine.domain(domain) else {
            tracing::debug!(domain, "no rules for this domain");
            return Ok(EnvoyAnswer {
                outcomes: vec![DescriptorOutcome::None; descriptors.len()],
                over: false,
                response_headers: loaded.config.server.envoy.response_headers.clone(),
                dynamic_metadata: loaded.config.server.envoy.dynamic_metadata,
            });
        };
        let mut hits = found.hits(descriptors.iter().map(|(d, _, limit)| (d, *limit)));
        let now = over_cache::now_micros();
        // Per descriptor: over its limit as the local cache knows, not asked of the store.
        let mut cached = vec![false; hits.len()];
        // Whether one of them is over, and not in shadow mode.
        let mut cached_over = false;
        let (mut items, mut names) = (Vec::new(), Vec::new());
        for (i, (hit, (_, cost, _))) in hits.iter_mut().zip(descriptors).enumerate() {
            if let DescriptorHit::Limited {
                hit, metric, limit, ..
            } = hit
            {
                if hit.key.len() > tollgate::MAX_KEY_LEN {
                    hit.key = digested(&hit.key);
                }
                if let Some(cache) = &self.over_cache
                    && cache.over(hit.rule, &hit.key, limit.unit.1, now)
                {
                    cached[i] = true;
                    cached_over |= !limit.shadow;
                    continue;
                }
                items.push(hit.item(*cost));
                names.push(metric.take());
            }
        }
        let stop_when_over = loaded.config.server.envoy.stop_when_over;
        // With `stop_when_over`, a descriptor the cache knows is over keeps the others from
        // counting: they are only looked at.
        let looked = stop_when_over && cached_over;
        if looked {
            for item in &mut items {
                item.cost = 0;
            }
        }
        // Whether the checked descriptors' hits were counted.
        let mut counted = !looked;
        let decisions: Vec<Decision> = if stop_when_over {
            let decisions = self
                .service
                .check_items(&loaded, &items, Some(&names))
                .await?
                .decisions;
            counted &= decisions.iter().all(Decision::allowed);
            decisions.iter().copied().collect()
        } else {
            // Each apart, so that each counts; sent together (CHECKS_AT_ONCE at a time: each
            // check's future takes kilobytes, and a message may bring 1,024 descriptors), so
            // that Redis gets them in one write, unless a descriptor comes twice: then in
            // order, so that the first counts first (9, then 8), as Envoy's service pipelines
            // them.
            let twice = items.iter().enumerate().any(|(i, a)| {
                items[..i]
                    .iter()
                    .any(|b| a.rule == b.rule && a.key == b.key)
            });
            let at_once = if twice { 1 } else { CHECKS_AT_ONCE };
            let mut decisions = Vec::with_capacity(items.len());
            for (items, names) in items.chunks(at_once).zip(names.chunks(at_once)) {
                let checks = items.iter().zip(names).map(|(item, name)| {
                    self.service.check_items(
                        &loaded,
                        std::slice::from_ref(item),
                        Some(std::slice::from_ref(name)),
                    )
                });
                for outcome in futures_util::future::join_all(checks).await {
                    decisions.extend(outcome?.decisions.iter().copied());
                }
            }
            decisions
        };
        // The items borrow from `hits`, which is consumed next.
        drop(items);
        let mut decisions = decisions.into_iter();
        let near_ratio = loaded.config.server.envoy.near_ratio;
        let record = |name: &str, hits: Hits| match loaded.envoy_stats(name) {
            Some(stats) => stats.record(hits),
            None => EnvoyStats::record_named(name, hits),
        };
        let outcomes: Vec<DescriptorOutcome> = hits
            .into_iter()
            .zip(descriptors)
            .zip(cached)
            .map(|((hit, (_, cost, _)), cached)| match hit {
                DescriptorHit::Limited { limit, stats, .. } if cached => {
                    record(
                        &stats,
                        Hits {
                            hits: *cost,
                            limit: limit.requests_per_unit,
                            after: None,
                            shadow: limit.shadow,
                            cached: true,
                            near_ratio,
                        },
                    );
                    DescriptorOutcome::Blocked {
                        reset_after: window_left(limit.unit.1),
                        limit: limit.into_owned(),
                    }
                }
                DescriptorHit::None => DescriptorOutcome::None,
                DescriptorHit::Unlimited(_) => DescriptorOutcome::Unlimited,
                DescriptorHit::Blocked { limit, stats } => {
                    let (hits, shadow) = (*cost, limit.shadow);
                    record(
                        stats,
                        Hits {
                            hits,
                            limit: 0,
                            after: None,
                            shadow,
                            cached: false,
                            near_ratio,
                        },
                    );
                    DescriptorOutcome::Blocked {
                        limit: limit.clone(),
                        reset_after: window_left(limit.unit.1),
                    }
                }
                DescriptorHit::Limited {
                    limit,
                    overridden,
                    stats,
                    hit,
                    ..
                } => match decisions.next() {
                    Some(decision) => {
                        let (over, remaining) = if overridden {
                            Domain::over(&limit, &decision)
                        } else if counted || !decision.allowed() {
                            (
                                !decision.allowed() || decision.shadowed(),
                                decision.remaining(),
                            )
                        } else if looked {
                            (false, decision.remaining().min(limit.requests_per_unit))
                        } else {
                            // Within its limit in a request over another: not counted.
                            let left = decision.remaining().saturating_add(*cost);
                            (false, left.min(limit.requests_per_unit))
                        };
                        if over && let Some(cache) = &self.over_cache {
                            cache.remember(hit.rule, &hit.key, limit.unit.1, now);
                        }
                        let shadow = limit.shadow;
                        let per_unit = limit.requests_per_unit;
                        let after = (!over).then(|| per_unit.saturating_sub(remaining));
                        let hits = Hits {
                            hits: *cost,
                            limit: per_unit,
                            after,
                            shadow,
                            cached: false,
                            near_ratio,
                        };
                        record(&stats, hits);
                        DescriptorOutcome::Checked {
                            limit: limit.into_owned(),
                            decision,
                            over: over && !shadow,
                            remaining: if over { 0 } else { remaining },
                        }
                    }
                    None => DescriptorOutcome::None,
                },
            })
            .collect();
        let over = DescriptorOutcome::overall_over(&outcomes, &loaded.config.server.envoy);
        Ok(EnvoyAnswer {
            outcomes,
            over,
            response_headers: loaded.config.server.envoy.response_headers.clone(),
            dynamic_metadata: loaded.config.server.envoy.dynamic_metadata,
        })
    }
}

/// The answer to an Envoy request: each descriptor's outcome, and the request's verdict.
#[derive(Debug, Clone)]
pub struct EnvoyAnswer {
    /// Each descriptor's outcome, in order.
    pub outcomes: Vec<DescriptorOutcome>,
    /// Whether the request is over the limit (see [`DescriptorOutcome::overall_over`]).
    pub over: bool,
    /// The names of the rate limit headers to ask Envoy to add, when the Envoy service's
    /// `LIMIT_RESPONSE_HEADERS_ENABLED` asks for them.
    pub response_headers: Option<[String; 3]>,
    /// Whether the answer carries dynamic metadata (`RESPONSE_DYNAMIC_METADATA`).
    pub dynamic_metadata: bool,
}

/// What each descriptor of an Envoy request got, as the Envoy ratelimit service answers it.
#[derive(Debug, Clone)]
pub enum DescriptorOutcome {
    /// No limit applies: OK.
    None,
    /// An `unlimited` limit: OK.
    Unlimited,
    /// A limit of 0 per unit: over it (OK in shadow mode), its window ending in
    /// `reset_after`.
    Blocked {
        /// The limit.
        limit: NodeLimit,
        /// Until the limit's window ends.
        reset_after: std::time::Duration,
    },
    /// A limit was checked.
    Checked {
        /// The limit, as configured or as the descriptor sent it.
        limit: NodeLimit,
        /// The store's decision.
        decision: Decision,
        /// Over the limit (in shadow mode, never).
        over: bool,
        /// Permits left in the window: 0 when over.
        remaining: u64,
    },
}

impl DescriptorOutcome {
    /// Whether the descriptor is over its limit (never in shadow mode).
    pub fn over(&self) -> bool {
        match self {
            Self::None | Self::Unlimited => false,
            Self::Blocked { limit, .. } => !limit.shadow,
            Self::Checked { over, .. } => *over,
        }
    }

    /// The request's verdict from its descriptors' outcomes, as the Envoy service gives it:
    /// over when a descriptor outside quota mode is over, or when there are descriptors in
    /// quota mode and every one of them is over; never in the global shadow mode. With the
    /// global quota mode every descriptor with a limit is in quota mode.
    pub fn overall_over(outcomes: &[Self], settings: &EnvoySettings) -> bool {
        if settings.shadow_mode {
            return false;
        }
        let quota = |o: &&Self| match o {
            Self::Blocked { limit, .. } | Self::Checked { limit, .. } => {
                limit.quota || settings.quota_mode
            }
            Self::None | Self::Unlimited => false,
        };
        let (quotas, others): (Vec<&Self>, Vec<&Self>) = outcomes.iter().partition(quota);
        others.iter().any(|o| o.over()) || (!quotas.is_empty() && quotas.iter().all(|o| o.over()))
    }

    /// The decisions of the checked descriptors of `outcomes`, in order: what the rate limit
    /// fields of an answer come from.
    pub fn decisions(outcomes: &[Self]) -> Vec<Decision> {
        outcomes
            .iter()
            .filter_map(|o| match o {
                Self::Checked { decision, .. } => Some(*decision),
                _ => None,
            })
            .collect()
    }
}

/// The counter key of a descriptor whose entries are longer than a key may be: `#sha256:`
/// and their SHA-256 digest. Keys built from entries start with a digit (the length of the
/// first part), so no descriptor's own key can be one of these.
fn digested(key: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    let mut digested = b"#sha256:".to_vec();
    digested.extend_from_slice(&sha2::Sha256::digest(key));
    digested
}

/// What is left of the current window of `unit` (windows aligned to the epoch, as the
/// fixed windows count), by the system clock.
fn window_left(unit: std::time::Duration) -> std::time::Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let unit_micros = unit.as_micros().max(1);
    let into = now.as_micros() % unit_micros;
    std::time::Duration::from_micros(u64::try_from(unit_micros - into).unwrap_or(u64::MAX))
}
