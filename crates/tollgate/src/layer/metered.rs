//! Metered work under the layer ([`RateLimitLayer::metered`](super::RateLimitLayer::metered)):
//! each request reserves an estimate before the handler runs, and the real cost is committed
//! once the response's body has been sent. The handler states the real cost by putting a
//! [`Cost`] in its response's extensions, or, while a body streams (an LLM answer's tokens as
//! they arrive), by recording it on the [`Meter`] in its request's extensions. A response that
//! states none is committed at the estimate; a request abandoned before its answer (the
//! client gone mid-handler) settles when its reservation expires, as its rules say.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};

use crate::clock::Clock;
use crate::limiter::Limiter;
use crate::store::Store;

/// The real cost of a request's work, known once it is done (an LLM answer's tokens): a
/// handler under a metered layer puts it in its response's extensions, and the layer commits
/// it in place of the estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost(pub u64);

/// The real cost of a request's work as the handler learns it, in each request's extensions
/// under a metered layer (axum: `Extension<Meter>`): for answers whose cost is known only as
/// their body streams. What it holds when the body ends is committed. Cheap to clone; any
/// task may record on it.
#[derive(Debug, Clone)]
pub struct Meter(Arc<AtomicU64>);

/// A meter on which nothing was recorded.
const UNSET: u64 = u64::MAX;

impl Default for Meter {
    fn default() -> Self {
        Self(Arc::new(AtomicU64::new(UNSET)))
    }
}

impl Meter {
    /// The work's cost is `cost`.
    pub fn set(&self, cost: u64) {
        self.0.store(cost.min(UNSET - 1), Ordering::Relaxed);
    }

    /// The work cost `cost` more (from nothing, if nothing was recorded yet).
    pub fn add(&self, cost: u64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                let base = if now == UNSET { 0 } else { now };
                Some(base.saturating_add(cost).min(UNSET - 1))
            });
    }

    /// What was recorded, if anything.
    pub fn get(&self) -> Option<u64> {
        match self.0.load(Ordering::Relaxed) {
            UNSET => None,
            cost => Some(cost),
        }
    }
}

/// What commits one reservation: at the meter's cost, or at the estimate.
pub(super) struct Settlement<S: Store, C: Clock> {
    pub(super) limiter: Arc<Limiter<S, C>>,
    pub(super) id: String,
    pub(super) meter: Meter,
    pub(super) estimate: u64,
}

type Settling = Pin<Box<dyn Future<Output = ()> + Send>>;

impl<S: Store, C: Clock> Settlement<S, C> {
    /// Commits the reservation; a commit the store did not take is logged as an error (the
    /// reservation then settles when it expires, as its rules say).
    fn settle(self) -> Settling {
        Box::pin(async move {
            let actual = self.meter.get().unwrap_or(self.estimate);
            if let Err(e) = self.limiter.commit(&self.id, actual).await {
                tracing::error!(
                    reservation = %self.id,
                    cost = actual,
                    error = %e,
                    "the work's real cost was not committed: its reservation settles when it \
                     expires, as its rules say"
                );
            }
        })
    }

    /// Settles without waiting: on the runtime, or, with none, when the reservation expires.
    pub(super) fn spawn(self) {
        spawn(self.settle());
    }

    /// `body`, committing the reservation once it has been sent whole (before it reports its
    /// end), or, dropped before, at once in the background.
    pub(super) fn around(self, body: Body) -> Body {
        Body::new(MeteredBody {
            inner: body,
            settlement: Some(self),
            settling: None,
        })
    }
}

fn spawn(settling: Settling) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(settling)),
        Err(_) => tracing::error!(
            "no runtime to commit a reservation on: it settles when it expires, as its rules say"
        ),
    }
}

/// A response body that commits its request's reservation at its end.
struct MeteredBody<S: Store, C: Clock> {
    inner: Body,
    settlement: Option<Settlement<S, C>>,
    settling: Option<Settling>,
}

impl<S: Store, C: Clock> Unpin for MeteredBody<S, C> {}

impl<S: Store, C: Clock> http_body::Body for MeteredBody<S, C> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(settling) = &mut this.settling {
                ready!(settling.as_mut().poll(cx));
                this.settling = None;
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(frame) => return Poll::Ready(Some(frame)),
                None => match this.settlement.take() {
                    Some(settlement) => this.settling = Some(settlement.settle()),
                    None => return Poll::Ready(None),
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.settlement.is_none() && self.settling.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<S: Store, C: Clock> Drop for MeteredBody<S, C> {
    fn drop(&mut self) {
        // A client gone mid-body: what the meter holds is committed all the same, and a
        // commit under way is finished rather than cut between its steps.
        if let Some(settlement) = self.settlement.take() {
            settlement.spawn();
        }
        if let Some(settling) = self.settling.take() {
            spawn(settling);
        }
    }
}

/// When a layer and its clones last settled the reservations that expired in their store
/// (µs, the limiter's clock): at most once a second, in the background, so that released
/// estimates come back without a sweeper of the application's own.
#[derive(Debug, Default)]
pub(super) struct Sweeps {
    last: AtomicU64,
}

impl Sweeps {
    /// Settles expired reservations in the background, unless that was done within a second.
    pub(super) fn maybe<S: Store, C: Clock>(&self, limiter: &Arc<Limiter<S, C>>) {
        let now = limiter.clock().now_micros();
        let last = self.last.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= 1_000_000;
        if !due
            || self
                .last
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let limiter = limiter.clone();
        spawn(Box::pin(async move {
            if let Err(e) = limiter.settle_expired(1_000).await {
                tracing::warn!(error = %e, "expired reservations not settled yet");
            }
        }));
    }
}
