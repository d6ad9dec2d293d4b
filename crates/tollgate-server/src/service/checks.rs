//! The checks every protocol asks for: of an HTTP request against the routes, of one key of
//! a rule, and of any items at once, all-or-nothing, with the console's and the metrics' view
//! of each.

use super::*;

impl Service {
    /// Checks an HTTP request against the routes, `cost` permits, all-or-nothing; with
    /// `limit`, the rules that take a stated limit apply it (see [`MAX_CALLER_LIMITS`]).
    ///
    /// # Errors
    /// [`CheckError`] for a cost no rule can admit, or a limit no rule takes.
    pub async fn check_request<H: Headers + ?Sized>(
        &self,
        request: &Request<'_, H>,
        cost: u64,
        limit: Option<&config::TierSpec>,
    ) -> Result<Outcome, CheckError> {
        if let Some(console) = self.console.get() {
            console.arrived(request);
        }
        let loaded = self.loaded();
        let hits = loaded.engine.hits(request);
        let items = Items::of(&hits, cost);
        let (rebuilt, items) = self.prepared(&loaded, &items, limit).await?;
        let loaded = rebuilt.as_deref().unwrap_or(&loaded);
        self.check_items(loaded, &items, None).await
    }

    /// Checks one key under one rule by name (with `limit`, as
    /// [`check_request`](Self::check_request)).
    ///
    /// # Errors
    /// [`CheckError`] for an unknown rule or a bad key or cost.
    pub async fn check_key(
        &self,
        rule: &str,
        key: &[u8],
        cost: u64,
        limit: Option<&config::TierSpec>,
    ) -> Result<Outcome, CheckError> {
        let loaded = self.loaded();
        let Some(found) = loaded.engine.rules().find(|r| r.name() == rule) else {
            return Err(CheckError::Invalid(format!("unknown rule `{rule}`")));
        };
        let item = [Item::new(found.name(), key, cost)];
        let (rebuilt, items) = self.prepared(&loaded, &item, limit).await?;
        let loaded = rebuilt.as_deref().unwrap_or(&loaded);
        self.check_items(loaded, &items, None).await
    }

    /// Checks `items` all-or-nothing, recording each decision under its rule, or under its
    /// name in `named` where it has one (Envoy's detailed metrics). Overrides and stated
    /// limits are the caller's to apply.
    pub async fn check_items(
        &self,
        loaded: &Loaded,
        items: &[Item<'_>],
        named: Option<&[Option<String>]>,
    ) -> Result<Outcome, CheckError> {
        let Some(limiter) = &loaded.limiter else {
            return Ok(Outcome::default());
        };
        if items.is_empty() {
            return Ok(Outcome::default());
        }
        // Lists are for native rules: Envoy's descriptors (named) each get their decision.
        let given = items.len();
        let screened = match named {
            None => self.lists.screen(loaded, items),
            Some(_) => None,
        };
        let (items, waved) = match screened {
            None => (std::borrow::Cow::Borrowed(items), Vec::new()),
            Some(lists::Screened::Denied {
                decisions,
                forbidden,
            }) => {
                return Ok(Outcome {
                    decisions,
                    permit: None,
                    forbidden,
                });
            }
            Some(lists::Screened::Check(kept, waved)) => (std::borrow::Cow::Owned(kept), waved),
        };
        let items = &items[..];
        if items.is_empty() {
            return Ok(Outcome::of(waved.into_iter().map(|(_, d)| d).collect()));
        }
        if let Some((cache, _)) = &loaded.denied
            && let Some(decisions) = cache.deny(items, denied::now_micros())
        {
            for decision in decisions.iter() {
                metrics::denied_cache(decision.rule());
                if let Some(m) = loaded.metrics.get(decision.rule()) {
                    m.record(decision);
                }
            }
            return Ok(Outcome::of(decisions));
        }
        let started = Instant::now();
        let (mut decisions, permit) = if loaded.holds_slots {
            let held = limiter.hold(items).await?;
            let permit = held.id().map(|id| Permit {
                id: id.to_string(),
                expires_in: metered::until(held.expires_at()),
            });
            if permit.is_some() {
                metrics::permit("held");
            }
            (held.decisions().clone(), permit)
        } else {
            (limiter.check_batch(items).await?, None)
        };
        let took = started.elapsed();
        metrics::record_latency(&self.latency, took);
        for (i, decision) in decisions.iter().enumerate() {
            let name = named.and_then(|n| n[i].as_deref());
            match (name, loaded.metrics.get(decision.rule())) {
                (None, Some(m)) => m.record(decision),
                (Some(name), _) => metrics::decision(name, decision),
                (None, None) => metrics::decision(decision.rule(), decision),
            }
        }
        if let Some(regions) = self.store.regions()
            && decisions.allowed()
        {
            for (item, decision) in items.iter().zip(decisions.iter()) {
                if matches!(
                    decision.source(),
                    tollgate::Source::Global | tollgate::Source::Partitioned
                ) {
                    metrics::region_admitted(regions.region(), decision.rule(), item.cost);
                }
            }
        }
        if let Some(console) = self.console.get() {
            let second = console.at(started) / 1_000_000;
            // A batch's items in order, then its decisions (items of one rule and key merged).
            let decided = items.iter().map(|item| item.key).zip(decisions.iter());
            console.checked(second, took, decided);
        }
        if !decisions.allowed() {
            if let Some((cache, rules)) = &loaded.denied {
                cache.remember(items, &decisions, denied::now_micros(), |r| {
                    rules.contains(r)
                });
            }
            self.ban(loaded, items, &mut decisions).await;
        }
        if !waved.is_empty() {
            // Every item's decision in the order given: the allowed ones' in their places.
            let mut checked = decisions.iter().copied();
            let mut waved = waved.into_iter().peekable();
            decisions = (0..given)
                .filter_map(|i| match waved.peek() {
                    Some((at, _)) if *at == i => waved.next().map(|(_, d)| d),
                    _ => checked.next(),
                })
                .collect();
        }
        Ok(Outcome {
            decisions,
            permit,
            forbidden: false,
        })
    }
}
