//! A guard over slots held on concurrency rules (see [`Limiter::hold`]): they are given back
//! when it is dropped.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, Decisions};
use crate::error::Error;
use crate::limiter::{Item, Limiter};
use crate::reservation::Reservation;
use crate::store::{MemoryStore, Store};

/// What [`Limiter::permit`] answered: the decisions, and when admitted, the slots held until
/// this guard is released or dropped (or their lease ends first). Dropped, it gives them back
/// at once on a store that decides in process, and in the background on the Tokio runtime
/// otherwise (with no runtime, they free themselves when their lease ends, and an error is
/// logged).
#[must_use = "the slots are given back when the permit is dropped"]
pub struct Permit<S: Store = MemoryStore, C: Clock = SystemClock> {
    limiter: Arc<Limiter<S, C>>,
    held: Reservation,
    /// The permit's id while its slots are held.
    id: Option<String>,
}

impl<S: Store, C: Clock> std::fmt::Debug for Permit<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("id", &self.id)
            .field("decisions", self.held.decisions())
            .finish()
    }
}

impl<S: Store, C: Clock> Limiter<S, C> {
    /// [`hold`](Self::hold), with the slots held by a guard that gives them back when dropped.
    ///
    /// # Errors
    /// As [`hold`](Self::hold).
    pub async fn permit(self: &Arc<Self>, items: &[Item<'_>]) -> Result<Permit<S, C>, Error> {
        let held = self.hold(items).await?;
        Ok(Permit {
            limiter: self.clone(),
            id: held.id().map(str::to_string),
            held,
        })
    }
}

impl<S: Store, C: Clock> Permit<S, C> {
    /// Whether every item was admitted.
    pub fn allowed(&self) -> bool {
        self.held.allowed()
    }

    /// The binding decision.
    pub fn decision(&self) -> Decision {
        self.held.decision()
    }

    /// Each item's decision, in order.
    pub fn decisions(&self) -> &Decisions {
        self.held.decisions()
    }

    /// The permit's id while it holds slots.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// Renews the lease of the slots held (see [`Limiter::extend`]); returns when the permit
    /// now ends (µs since the epoch).
    ///
    /// # Errors
    /// As [`Limiter::extend`]; [`Error::UnknownReservation`] when it holds none.
    pub async fn extend(&self) -> Result<u64, Error> {
        match &self.id {
            Some(id) => self.limiter.extend(id).await,
            None => Err(Error::UnknownReservation { id: String::new() }),
        }
    }

    /// Gives the slots back now, and says what each key has left (nothing when it held
    /// none).
    ///
    /// # Errors
    /// As [`Limiter::release`].
    pub async fn release(mut self) -> Result<Decisions, Error> {
        match self.id.take() {
            Some(id) => self.limiter.release(&id).await,
            None => Ok(Decisions::default()),
        }
    }
}

impl<S: Store, C: Clock> Drop for Permit<S, C> {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let limiter = self.limiter.clone();
        let mut release = Box::pin(async move {
            if let Err(e) = limiter.release(&id).await {
                tracing::warn!(
                    permit = %id,
                    error = %e,
                    "a dropped permit's slots were not given back: they free themselves when \
                     their lease ends"
                );
            }
        });
        // A store that decides in process is done at once.
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready(()) = release.as_mut().poll(&mut cx) {
            return;
        }
        spawn(release);
    }
}

#[cfg(any(feature = "redis", feature = "tower"))]
fn spawn(release: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(release)),
        Err(_) => tracing::error!(
            "a permit dropped outside a Tokio runtime: its slots free themselves when their \
             lease ends"
        ),
    }
}

#[cfg(not(any(feature = "redis", feature = "tower")))]
fn spawn(_release: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) {
    tracing::error!(
        "a permit whose release waits, dropped: its slots free themselves when their lease ends"
    );
}
