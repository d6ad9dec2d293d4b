//! Whether a service is healthy and ready, what a Redis outage leaves it, and its shutdown.

use super::*;

impl Service {
    /// Marks the service as stopping: it is no longer healthy (see [`Service::healthy`]),
    /// so that load balancers stop sending to it while it drains.
    pub fn terminate(&self) {
        self.terminating.store(true, Ordering::Relaxed);
    }

    /// Whether the service is healthy, as the Envoy ratelimit service's health check says it
    /// (`/healthcheck`, and gRPC's `grpc.health.v1.Health`): not stopping; its Redis, if
    /// any, answered since start (with `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`: answers now);
    /// and, with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, an Envoy domain is loaded.
    pub fn healthy(&self) -> bool {
        let loaded = self.loaded();
        let envoy = &loaded.config.server.envoy;
        let configured = !envoy.healthy_with_config || loaded.engine.domains().next().is_some();
        let redis = match self.store.redis() {
            None => true,
            Some(_) if envoy.health_follows_redis => self.ready(),
            Some(_) => self.redis_confirmed.load(Ordering::Relaxed),
        };
        !self.terminating.load(Ordering::Relaxed) && redis && configured
    }

    /// Asks the shared store's Redis, if any, until it answers, as the Envoy service waits
    /// for Redis at start: first at once, then after `startup.initial`, the waits doubling up
    /// to `startup.max`. Until it answers, `/healthcheck` says the service is unhealthy
    /// (checks are answered meanwhile, by the rules' failure policies).
    ///
    /// # Errors
    /// Redis did not answer within `startup.give_up`.
    pub async fn wait_for_redis(&self, startup: config::Startup) -> anyhow::Result<()> {
        let Some(redis) = self.store.redis() else {
            return Ok(());
        };
        let started = Instant::now();
        let mut wait = startup.initial;
        loop {
            match redis.ping().await {
                Ok(()) => {
                    self.redis_confirmed.store(true, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) => {
                    if let Some(give_up) = startup.give_up
                        && started.elapsed() + wait > give_up
                    {
                        anyhow::bail!(
                            "Redis did not answer within {give_up:?} \
                             (REDIS_STARTUP_MAX_ELAPSED_TIME): {e}"
                        );
                    }
                    tracing::warn!(error = %e, retry_in = ?wait, "Redis does not answer yet");
                }
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(startup.max);
        }
    }

    /// Whether the service can decide: rules are loaded and the shared store, if any, answers
    /// some checks (one server that answers; a cluster with a node that answers: a partial
    /// outage, which [`outage`](Self::outage) describes, leaves the service ready).
    pub fn ready(&self) -> bool {
        match self.region_store() {
            AnyStore::Redis(redis) => !redis.down(),
            _ => true,
        }
    }

    /// This region's store: the store itself, or under a store of regions, its local one.
    fn region_store(&self) -> &AnyStore {
        self.store.regions().map_or(&self.store, |r| r.local())
    }

    /// What each region admitted of `key` under global rule `rule` in its current window,
    /// tier by tier; `None` when no loaded global rule has that id (or the store has no
    /// regions).
    ///
    /// # Errors
    /// This region's Redis did not answer.
    pub async fn region_usage(
        &self,
        rule: &str,
        key: &[u8],
    ) -> Result<Option<Vec<Vec<(String, u64)>>>, Error> {
        let loaded = self.loaded();
        let (Some(regions), Some(limiter)) = (self.store.regions(), &loaded.limiter) else {
            return Ok(None);
        };
        let (Some(found), Some(tollgate::AnyPlan::Regions(plan))) = (
            limiter.rules().find(|r| r.name() == rule),
            limiter.plan(rule),
        ) else {
            return Ok(None);
        };
        if !matches!(found.scope_of(), tollgate::Scope::Global(_)) {
            return Ok(None);
        }
        let now = tollgate::Clock::now_micros(limiter.clock());
        regions.usage(found, plan, key, now).await.map(Some)
    }

    /// The peer regions this region does not hear now (each, and for how long it has not;
    /// `None`: never since start), when the store has regions.
    pub fn unheard_peers(&self) -> Vec<(String, Option<std::time::Duration>)> {
        let Some(regions) = self.store.regions() else {
            return Vec::new();
        };
        regions
            .peers()
            .into_iter()
            .filter(|p| p.failing)
            .map(|p| (p.name, p.last_heard))
            .collect()
    }

    /// On a Redis Cluster some of whose masters keep failing: how many, of how many, and how
    /// many of the 16384 slots their checks' failure policies decide now.
    pub fn outage(&self) -> Option<Outage> {
        let AnyStore::Redis(redis) = self.region_store() else {
            return None;
        };
        let nodes = redis.nodes();
        let failing: Vec<_> = nodes.iter().filter(|n| n.failing).collect();
        (!failing.is_empty()).then(|| Outage {
            failing: failing.iter().map(|n| n.address.clone()).collect(),
            nodes: nodes.len(),
            slots: failing.iter().map(|n| n.slots).sum(),
        })
    }

    /// Records the store's gauges (keys held, calls saved, failures) for the metrics endpoint.
    pub fn observe(&self) {
        if let Some(regions) = self.store.regions() {
            metrics::regions(regions.region(), &regions.peers(), regions.dropped());
        }
        match self.region_store() {
            AnyStore::Memory(m) => {
                metrics::store_held(m.keys(), Some(m.bytes()));
                metrics::store_bound(m.evictions(), m.limiting_evictions(), m.refused());
            }
            AnyStore::Hybrid(h) => {
                let stats = h.stats();
                metrics::store_held(h.keys(), None);
                metrics::calls_saved(stats.decisions.saturating_sub(stats.calls));
            }
            AnyStore::Lease(l) => {
                let stats = l.stats();
                metrics::store_held(l.keys(), None);
                metrics::calls_saved(stats.decisions.saturating_sub(stats.calls));
            }
            _ => {}
        }
        if let Some(failures) = self.store.failures() {
            metrics::store_failures(self.store.kind(), failures);
            metrics::fallback_active(self.store.degraded());
        }
        if let AnyStore::Redis(redis) = self.region_store() {
            metrics::redis_nodes(&redis.nodes());
        }
    }

    /// Finishes the store's shared business: pushes hybrid counts, returns unused leases, and
    /// takes this instance's console summary off the shared list.
    pub async fn shutdown(&self) {
        if let (Some(console), Some(shared)) = (self.console.get(), &self.shared) {
            console.retire();
            if let Err(e) = shared.forget_instance(&console.instance).await {
                tracing::debug!(error = %e, "cannot take this instance off the console's list");
            }
        }
        self.store.shutdown().await;
    }
}

/// A partial outage of a Redis Cluster: see [`Service::outage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outage {
    /// The addresses of the masters failing.
    pub failing: Vec<String>,
    /// The masters serving slots.
    pub nodes: usize,
    /// The slots of the failing masters, whose checks the failure policies decide.
    pub slots: usize,
}
