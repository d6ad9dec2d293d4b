//! Reservations: an estimate taken before work whose cost is known only once it is done (an
//! LLM call's tokens), settled after it (see [`Limiter::reserve`](crate::Limiter::reserve)).

use crate::decision::{Decision, Decisions};

/// What [`Limiter::reserve`](crate::Limiter::reserve) answered: the decisions of the estimate,
/// and, when it was taken and recorded, the id to settle it by.
#[derive(Debug, Clone)]
pub struct Reservation {
    pub(crate) id: Option<String>,
    pub(crate) decisions: Decisions,
    pub(crate) expires: u64,
}

impl Reservation {
    /// The id to [`commit`](crate::Limiter::commit) or [`cancel`](crate::Limiter::cancel)
    /// by, or a permit's to [`release`](crate::Limiter::release) by: 32 hex digits,
    /// unguessable. `None` when the estimate was denied (nothing was
    /// taken), or admitted by a failure policy while the store failed (nothing was counted,
    /// so there is nothing to settle).
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// Whether the estimate was admitted (by every rule).
    pub fn allowed(&self) -> bool {
        self.decisions.allowed()
    }

    /// Each item's decision, in order.
    pub fn decisions(&self) -> &Decisions {
        &self.decisions
    }

    /// The binding decision.
    pub fn decision(&self) -> Decision {
        self.decisions.binding().expect("a reservation has an item")
    }

    /// When it expires unsettled, in µs since the Unix epoch (the limiter's clock); 0 when
    /// it has no id.
    pub fn expires_at(&self) -> u64 {
        self.expires
    }
}

/// A new reservation id: 128 random bits as 32 hex digits.
pub(crate) fn new_id() -> String {
    let mut bytes = [0u8; 16];
    // The system's generator; a process without one cannot make unguessable ids, and the
    // clock and a counter at least keep them apart.
    if getrandom::fill(&mut bytes).is_err() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        bytes[..8].copy_from_slice(&now.to_le_bytes());
        bytes[8..].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(32);
    for b in bytes {
        id.push(char::from(HEX[usize::from(b >> 4)]));
        id.push(char::from(HEX[usize::from(b & 15)]));
    }
    id
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_32_hex_digits_and_apart() {
        let (a, b) = (super::new_id(), super::new_id());
        assert_ne!(a, b);
        for id in [a, b] {
            assert_eq!(id.len(), 32);
            assert!(
                id.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
                "{id}"
            );
        }
    }
}
