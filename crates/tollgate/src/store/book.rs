//! Reservations kept until they are settled: each one's record (what it took, when, and what
//! happens when it expires unsettled), and the book a process keeps them in for the memory
//! store. The Redis store keeps the same records in Redis, encoded as [`ReservationRecord::encode`]
//! writes them, so that they outlive the process.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use crate::error::Error;

/// The most open reservations a store keeps when none is configured.
pub const DEFAULT_MAX_RESERVATIONS: usize = 100_000;

/// What one reservation took: each item's rule, key and cost (the estimate), taken at `at`
/// (µs since the epoch), to be settled before `expires` (µs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationRecord {
    /// The reservation's id: 32 hex digits.
    pub id: String,
    /// When its costs were taken (µs since the epoch, the limiter's clock).
    pub at: u64,
    /// When it expires unsettled (µs since the epoch).
    pub expires: u64,
    /// What it took.
    pub items: Vec<ReservedItem>,
}

/// One item a reservation took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservedItem {
    /// The rule's name.
    pub rule: String,
    /// The key.
    pub key: Vec<u8>,
    /// The estimate taken.
    pub cost: u64,
    /// Whether the estimate comes back when the reservation expires unsettled (the rule's
    /// choice); otherwise it stays taken, as if the work used exactly its estimate.
    pub release: bool,
}

impl ReservationRecord {
    /// The record as bytes: every number as 8 little-endian bytes, every string or key after
    /// its length.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.items.len() * 64);
        let bytes = |b: &[u8], out: &mut Vec<u8>| {
            out.extend_from_slice(&(b.len() as u64).to_le_bytes());
            out.extend_from_slice(b);
        };
        bytes(self.id.as_bytes(), &mut out);
        out.extend_from_slice(&self.at.to_le_bytes());
        out.extend_from_slice(&self.expires.to_le_bytes());
        out.extend_from_slice(&(self.items.len() as u64).to_le_bytes());
        for item in &self.items {
            bytes(item.rule.as_bytes(), &mut out);
            bytes(&item.key, &mut out);
            out.extend_from_slice(&item.cost.to_le_bytes());
            out.push(u8::from(item.release));
        }
        out
    }

    /// A record from [`encode`](Self::encode)'s bytes.
    ///
    /// # Errors
    /// [`Error::Store`] for bytes that are not a record.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let mut rest = bytes;
        let bad = || Error::Store {
            message: "a reservation record that cannot be read".into(),
            transient: false,
        };
        let number = |rest: &mut &[u8]| -> Result<u64, Error> {
            let (head, tail) = rest.split_first_chunk::<8>().ok_or_else(bad)?;
            *rest = tail;
            Ok(u64::from_le_bytes(*head))
        };
        fn take<'a>(rest: &mut &'a [u8], n: u64) -> Option<&'a [u8]> {
            let n = usize::try_from(n).ok()?;
            let (head, tail) = rest.split_at_checked(n)?;
            *rest = tail;
            Some(head)
        }
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| bad());
        let len = number(&mut rest)?;
        let id = text(take(&mut rest, len).ok_or_else(bad)?)?;
        let at = number(&mut rest)?;
        let expires = number(&mut rest)?;
        let count = number(&mut rest)?;
        let mut items = Vec::new();
        for _ in 0..count.min(super::MAX_BATCH as u64) {
            let len = number(&mut rest)?;
            let rule = text(take(&mut rest, len).ok_or_else(bad)?)?;
            let len = number(&mut rest)?;
            let key = take(&mut rest, len).ok_or_else(bad)?.to_vec();
            let cost = number(&mut rest)?;
            let release = take(&mut rest, 1).ok_or_else(bad)?[0] == 1;
            items.push(ReservedItem {
                rule,
                key,
                cost,
                release,
            });
        }
        Ok(Self {
            id,
            at,
            expires,
            items,
        })
    }
}

/// The refusal of a full book: no reservation is made.
pub(crate) fn full(max: usize) -> Error {
    Error::ReservationsFull { max }
}

/// Open reservations in this process, at most `max`, by id and by expiry. Shared by the
/// store's clones; each call takes one lock.
#[derive(Debug)]
pub(crate) struct Book {
    max: usize,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    by_id: HashMap<String, ReservationRecord>,
    by_expiry: BTreeSet<(u64, String)>,
}

impl Book {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            open: Mutex::new(Open::default()),
        }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `record` until it is taken or expires.
    ///
    /// # Errors
    /// The book holds its most already (see [`full`]).
    pub(crate) fn keep(&self, record: ReservationRecord) -> Result<(), Error> {
        let mut open = self.open();
        if open.by_id.len() >= self.max {
            return Err(full(self.max));
        }
        open.by_expiry.insert((record.expires, record.id.clone()));
        open.by_id.insert(record.id.clone(), record);
        Ok(())
    }

    /// Takes the record of `id` out of the book: `None` if it is not there (unknown, settled,
    /// or expired and settled by [`expired`](Self::expired)).
    pub(crate) fn take(&self, id: &str) -> Option<ReservationRecord> {
        let mut open = self.open();
        let record = open.by_id.remove(id)?;
        open.by_expiry.remove(&(record.expires, record.id.clone()));
        Some(record)
    }

    /// Takes out up to `limit` records expired at `now`, oldest first.
    pub(crate) fn expired(&self, now: u64, limit: usize) -> Vec<ReservationRecord> {
        let mut open = self.open();
        let due: Vec<(u64, String)> = open
            .by_expiry
            .iter()
            .take_while(|(expires, _)| *expires <= now)
            .take(limit)
            .cloned()
            .collect();
        due.into_iter()
            .filter_map(|entry| {
                open.by_expiry.remove(&entry);
                open.by_id.remove(&entry.1)
            })
            .collect()
    }

    /// Open reservations now.
    pub(crate) fn len(&self) -> usize {
        self.open().by_id.len()
    }
}

/// The latest records a store kept, by id, to commit them in one call without reading them
/// first (see [`Store::kept_record`](super::Store::kept_record)). Bounded: the oldest are
/// forgotten first (their commits then read the record first).
#[cfg(feature = "redis")]
#[derive(Debug, Default)]
pub(crate) struct Remembered {
    inner: Mutex<RememberedInner>,
}

#[cfg(feature = "redis")]
#[derive(Debug, Default)]
struct RememberedInner {
    records: HashMap<String, ReservationRecord>,
    /// Ids in the order they were remembered; some may be forgotten already.
    order: std::collections::VecDeque<String>,
}

#[cfg(feature = "redis")]
impl Remembered {
    /// The most records remembered.
    pub(crate) const MOST: usize = 16_384;

    pub(crate) fn remember(&self, record: &ReservationRecord) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.order.len() >= Self::MOST
            && let Some(oldest) = inner.order.pop_front()
        {
            inner.records.remove(&oldest);
        }
        inner.order.push_back(record.id.clone());
        inner.records.insert(record.id.clone(), record.clone());
    }

    /// Record `id`, forgotten here.
    pub(crate) fn take(&self, id: &str) -> Option<ReservationRecord> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.records.remove(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, expires: u64) -> ReservationRecord {
        ReservationRecord {
            id: id.into(),
            at: 5,
            expires,
            items: vec![ReservedItem {
                rule: "api".into(),
                key: b"k\x00\xff".to_vec(),
                cost: 10,
                release: true,
            }],
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = record("ab", 9);
        assert_eq!(ReservationRecord::decode(&r.encode()).unwrap(), r);
        assert!(ReservationRecord::decode(&r.encode()[..10]).is_err());
    }

    #[test]
    fn the_book_is_bounded_and_gives_each_record_once() {
        let book = Book::new(2);
        book.keep(record("a", 10)).unwrap();
        book.keep(record("b", 20)).unwrap();
        assert!(book.keep(record("c", 5)).is_err());
        assert_eq!(
            book.expired(15, 10)
                .iter()
                .map(|r| r.id.as_str())
                .collect::<Vec<_>>(),
            ["a"]
        );
        assert!(book.take("a").is_none());
        assert_eq!(book.take("b").unwrap().id, "b");
        assert_eq!(book.len(), 0);
    }

    #[cfg(feature = "redis")]
    #[test]
    fn the_records_remembered_are_the_latest_few() {
        let remembered = Remembered::default();
        let record = |i: usize| ReservationRecord {
            id: format!("{i:032x}"),
            at: 1,
            expires: 2,
            items: Vec::new(),
        };
        for i in 0..Remembered::MOST + 10 {
            remembered.remember(&record(i));
        }
        assert!(
            remembered.take(&record(9).id).is_none(),
            "the oldest are forgotten"
        );
        assert_eq!(remembered.take(&record(10).id), Some(record(10)));
        assert!(remembered.take(&record(10).id).is_none(), "taken once");
        let last = Remembered::MOST + 9;
        assert_eq!(remembered.take(&record(last).id), Some(record(last)));
    }
}
