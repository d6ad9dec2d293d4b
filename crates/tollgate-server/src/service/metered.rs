//! Metered work: costs known once the work is done. Reports take a cost whatever a key's
//! state; reservations take an estimate before the work and settle it after (see
//! [`tollgate::Limiter::reserve`]). Each is asked of a request (every rule it matches) or of
//! a rule and a key, as a check is.

use std::time::Duration;

use tollgate::engine::{Headers, Hit, Items, Request};
use tollgate::{Settle, Store};

use super::{CheckError, Loaded, Outcome, Service};
use crate::config::TierSpec;
use crate::metrics;

/// What metered work is about: a request to match against the routes, or a rule and a key.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a, H: Headers + ?Sized> {
    /// Every rule the request matches.
    Request(&'a Request<'a, H>),
    /// One key under one rule, by name.
    Key {
        /// The rule's name.
        rule: &'a str,
        /// The key.
        key: &'a [u8],
    },
}

/// An estimate reserved: its id (none when denied, or admitted by a failure policy, which
/// counted nothing), when it expires, and the decisions.
#[derive(Debug, Clone)]
pub struct Metered {
    /// The id to commit or cancel by.
    pub id: Option<String>,
    /// Until it expires unsettled.
    pub expires_in: Duration,
    /// What the estimate got.
    pub outcome: Outcome,
}

/// The rules and keys `target` is about, under the rules loaded now.
fn hits<H: Headers + ?Sized>(
    loaded: &Loaded,
    target: Target<'_, H>,
) -> Result<Vec<Hit>, CheckError> {
    match target {
        Target::Request(request) => Ok(loaded.engine.hits(request)),
        Target::Key { rule, key } => match loaded.engine.rules().find(|r| r.name() == rule) {
            Some(found) => Ok(vec![Hit {
                rule: found.name(),
                key: key.to_vec(),
            }]),
            None => Err(CheckError::Invalid(format!("unknown rule `{rule}`"))),
        },
    }
}

/// µs since the epoch, by the system clock (the limiter's).
fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl Service {
    /// Takes `cost` whatever the keys' state (a report of work done): past a limit the key is
    /// in debt, and its checks are denied until time pays it back. The decisions say what
    /// each key has left: denied while in debt.
    ///
    /// # Errors
    /// [`CheckError`]: a bad target or cost; the store did not take it; it takes no reports.
    pub async fn report<H: Headers + ?Sized>(
        &self,
        target: Target<'_, H>,
        cost: u64,
        limit: Option<&TierSpec>,
    ) -> Result<Outcome, CheckError> {
        let loaded = self.loaded();
        let hits = hits(&loaded, target)?;
        let items = Items::of(&hits, cost);
        let (rebuilt, items) = self.prepared(&loaded, &items, limit).await?;
        let loaded = rebuilt.as_deref().unwrap_or(&loaded);
        let (Some(limiter), false) = (&loaded.limiter, items.is_empty()) else {
            return Ok(Outcome::default());
        };
        let decisions = limiter.settle_batch(&items, Settle::Report).await?;
        for decision in decisions.iter() {
            metrics::reported(decision.rule(), cost);
        }
        Ok(Outcome::of(decisions))
    }

    /// Reserves an estimate of `cost`, decided as a check (all-or-nothing across the rules
    /// that apply), to settle within `ttl` (or the rules' own time to live).
    ///
    /// # Errors
    /// As [`report`](Self::report); a full book of reservations is
    /// [`CheckError::Unavailable`].
    pub async fn reserve<H: Headers + ?Sized>(
        &self,
        target: Target<'_, H>,
        cost: u64,
        ttl: Option<Duration>,
        limit: Option<&TierSpec>,
    ) -> Result<Metered, CheckError> {
        let loaded = self.loaded();
        let hits = hits(&loaded, target)?;
        let items = Items::of(&hits, cost);
        let (rebuilt, items) = self.prepared(&loaded, &items, limit).await?;
        let loaded = rebuilt.as_deref().unwrap_or(&loaded);
        let (Some(limiter), false) = (&loaded.limiter, items.is_empty()) else {
            return Ok(Metered {
                id: None,
                expires_in: Duration::ZERO,
                outcome: Outcome::default(),
            });
        };
        let reserved = match limiter.reserve(&items, ttl).await {
            Ok(reserved) => reserved,
            Err(e) => {
                metrics::reservation("refused");
                return Err(e.into());
            }
        };
        for decision in reserved.decisions().iter() {
            if let Some(m) = loaded.metrics.get(decision.rule()) {
                m.record(decision);
            }
        }
        if reserved.id().is_some() {
            metrics::reservation("created");
        }
        Ok(Metered {
            id: reserved.id().map(str::to_string),
            expires_in: until(reserved.expires_at()),
            outcome: Outcome::of(reserved.decisions().clone()),
        })
    }

    /// Settles reservation `id` at its real cost `cost`: less than the estimate gives the
    /// difference back, more takes the excess.
    ///
    /// # Errors
    /// [`CheckError::UnknownReservation`] for an id unknown, settled or expired; as
    /// [`report`](Self::report).
    pub async fn commit(&self, id: &str, cost: u64) -> Result<Outcome, CheckError> {
        let loaded = self.loaded();
        let limiter = loaded.limiter.as_ref().ok_or_else(|| unknown(id))?;
        let decisions = limiter.commit(id, cost).await?;
        // Less than the estimate gives permits back: a denial kept here may no longer hold.
        loaded.clear_denied();
        metrics::reservation("committed");
        Ok(Outcome::of(decisions))
    }

    /// Cancels reservation `id`: its estimate comes back.
    ///
    /// # Errors
    /// As [`commit`](Self::commit).
    pub async fn cancel(&self, id: &str) -> Result<Outcome, CheckError> {
        let loaded = self.loaded();
        let limiter = loaded.limiter.as_ref().ok_or_else(|| unknown(id))?;
        let decisions = limiter.cancel(id).await?;
        loaded.clear_denied();
        metrics::reservation("cancelled");
        Ok(Outcome::of(decisions))
    }

    /// Gives back the slots held under `permit`.
    ///
    /// # Errors
    /// [`CheckError::UnknownReservation`] for a permit unknown, released or ended; as
    /// [`report`](Self::report).
    pub async fn release(&self, permit: &str) -> Result<Outcome, CheckError> {
        let loaded = self.loaded();
        let limiter = loaded.limiter.as_ref().ok_or_else(|| unknown(permit))?;
        let decisions = limiter.release(permit).await.map_err(unknown_permit)?;
        metrics::permit("released");
        Ok(Outcome::of(decisions))
    }

    /// Renews the lease of the slots held under `permit`; answers how long until it ends.
    ///
    /// # Errors
    /// As [`release`](Self::release).
    pub async fn extend(&self, permit: &str) -> Result<Duration, CheckError> {
        let loaded = self.loaded();
        let limiter = loaded.limiter.as_ref().ok_or_else(|| unknown(permit))?;
        let ends = limiter.extend(permit).await.map_err(unknown_permit)?;
        metrics::permit("extended");
        Ok(until(ends))
    }

    /// Settles the reservations expired unsettled, as their rules say, every second for as
    /// long as the service lives; any number of instances may, each settles its share.
    pub async fn settle_expired(self: std::sync::Arc<Self>) {
        let weak = std::sync::Arc::downgrade(&self);
        drop(self);
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A store that fails fails every second: said when it starts and when it ends.
        let mut failing = false;
        loop {
            every.tick().await;
            let Some(service) = weak.upgrade() else {
                return;
            };
            let loaded = service.loaded();
            let Some(limiter) = &loaded.limiter else {
                continue;
            };
            if limiter.store().settles().is_err() {
                return;
            }
            match limiter.settle_expired(1_000).await {
                Ok(settled) => {
                    if std::mem::take(&mut failing) {
                        tracing::info!("expired reservations are settled again");
                    }
                    if settled > 0 {
                        // Estimates released on expiry give permits back.
                        loaded.clear_denied();
                    }
                    for _ in 0..settled {
                        metrics::reservation("expired");
                    }
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "cannot settle expired reservations now: tried again every second, said again once they settle");
                }
                Err(_) => {}
            }
        }
    }
}

/// How long from now until `at` (µs since the epoch, the system clock's).
pub(super) fn until(at: u64) -> Duration {
    Duration::from_micros(at.saturating_sub(now_micros()))
}

/// An unknown reservation's error said of a permit.
fn unknown_permit(e: tollgate::Error) -> CheckError {
    match e {
        tollgate::Error::UnknownReservation { id } => CheckError::UnknownReservation(format!(
            "no permit `{id}` holds slots: unknown, released, or its lease ended"
        )),
        e => e.into(),
    }
}

/// The answer about an id when no rules are loaded.
fn unknown(id: &str) -> CheckError {
    CheckError::UnknownReservation(format!("no open reservation `{id}`: no rules are loaded"))
}
