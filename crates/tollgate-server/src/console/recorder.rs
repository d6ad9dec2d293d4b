//! The requests checked lately (method, path, client address and headers), kept for the impact
//! preview to replay through a proposed rule: the newest first to stay, within a byte budget,
//! so the span of time they cover shrinks as traffic grows (the preview says which span).
//! Records lie back to back in one ring of bytes, allocated once at the budget's size.
//! `authorization`, `cookie` and `proxy-authorization` are never kept, nor the headers that
//! carry `/v1/auth` the request line (kept as the method and path), and headers beyond
//! [`MAX_HEADER_BYTES`] of a request are left out.

use std::collections::VecDeque;
use std::net::IpAddr;

use tollgate::engine::{Headers, Request};

/// The most bytes of headers kept of one request.
pub const MAX_HEADER_BYTES: usize = 1_024;

/// What a record takes before its bytes: when it was checked (8 bytes) and its length (4).
const RECORD_HEAD: usize = 12;

/// What a recorder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Requests held.
    pub requests: usize,
    /// Bytes they take, with each one's head.
    pub bytes: usize,
    /// Requests let go to stay within the budget, since the start.
    pub dropped: u64,
    /// When the oldest held request was checked (µs since the epoch).
    pub oldest: Option<u64>,
}

/// Recent requests, within a byte budget. Not synchronized: its owner locks it (the
/// console keeps one per shard).
#[derive(Debug)]
pub struct Recorder {
    budget: usize,
    /// Records, oldest first: `at` and length (little endian), then the encoded request.
    bytes: VecDeque<u8>,
    requests: usize,
    /// Requests let go to stay within the budget.
    dropped: u64,
}

/// A recorded request, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// When it was checked (µs since the epoch).
    pub at: u64,
    /// Its method.
    pub method: String,
    /// Its path.
    pub path: String,
    /// The client's address, if known.
    pub client_ip: Option<IpAddr>,
    /// Its headers, as kept.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Recorded {
    /// The request, for the rule engine.
    pub fn headers(&self) -> Vec<(&str, &[u8])> {
        self.headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_slice()))
            .collect()
    }
}

impl Recorder {
    /// A recorder of at most `budget` bytes (its ring is allocated once, at that size).
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            bytes: VecDeque::with_capacity(budget),
            requests: 0,
            dropped: 0,
        }
    }

    /// Keeps `record` (from [`encode`]), letting the oldest go to stay within the budget; a
    /// record larger than the whole budget is let go itself.
    pub fn push(&mut self, record: &[u8]) {
        if record.len() > self.budget {
            self.dropped += 1;
            return;
        }
        while self.bytes.len() + record.len() > self.budget {
            let (_, len) = self.head(0);
            self.bytes.drain(..RECORD_HEAD + len);
            self.requests -= 1;
            self.dropped += 1;
        }
        self.bytes.extend(record.iter());
        self.requests += 1;
    }

    /// The head of the record at `offset`: (at, length).
    fn head(&self, offset: usize) -> (u64, usize) {
        let mut head = [0u8; RECORD_HEAD];
        for (b, byte) in head
            .iter_mut()
            .zip(self.bytes.range(offset..offset + RECORD_HEAD))
        {
            *b = *byte;
        }
        let at = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
        let len = u32::from_le_bytes(head[8..].try_into().unwrap_or_default());
        (at, len as usize)
    }

    /// A copy of every record, oldest first, to [`read`] once the lock is let go.
    pub fn copy(&self) -> Vec<u8> {
        let (a, b) = self.bytes.as_slices();
        [a, b].concat()
    }

    /// What the recorder holds now.
    pub fn held(&self) -> Held {
        Held {
            requests: self.requests,
            bytes: self.bytes.len(),
            dropped: self.dropped,
            oldest: (self.requests > 0).then(|| self.head(0).0),
        }
    }
}

/// The requests of `records` (a [`Recorder::copy`]) checked at or after `since` (µs since
/// the epoch), oldest first.
pub fn read(records: &[u8], since: u64) -> Vec<Recorded> {
    let mut out = Vec::new();
    let mut rest = records;
    while let Some((head, tail)) = rest.split_at_checked(RECORD_HEAD) {
        let at = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
        let len = u32::from_le_bytes(head[8..].try_into().unwrap_or_default()) as usize;
        let Some((record, tail)) = tail.split_at_checked(len) else {
            break;
        };
        if at >= since
            && let Some(recorded) = decode(at, record)
        {
            out.push(recorded);
        }
        rest = tail;
    }
    out
}

/// Writes the record of `request`, checked at `at` (µs since the epoch), into `record`
/// (cleared first), for [`Recorder::push`].
pub fn encode<H: Headers + ?Sized>(record: &mut Vec<u8>, at: u64, request: &Request<'_, H>) {
    record.clear();
    record.extend_from_slice(&at.to_le_bytes());
    record.extend_from_slice(&[0; 4]);
    encode_request(record, request);
    let len = u32::try_from(record.len() - RECORD_HEAD).unwrap_or(u32::MAX);
    record[8..RECORD_HEAD].copy_from_slice(&len.to_le_bytes());
}

/// Writes `request` into `bytes`: method, path, client address, then each header kept (its
/// name as given: reading lowercases it).
fn encode_request<H: Headers + ?Sized>(bytes: &mut Vec<u8>, request: &Request<'_, H>) {
    push_str(bytes, request.method);
    push_str(bytes, request.path);
    match request.client_ip {
        None => bytes.push(0),
        Some(IpAddr::V4(v4)) => {
            bytes.push(4);
            bytes.extend_from_slice(&v4.octets());
        }
        Some(IpAddr::V6(v6)) => {
            bytes.push(6);
            bytes.extend_from_slice(&v6.octets());
        }
    }
    let mut header_bytes = 0;
    request.headers.each(&mut |name, value| {
        let size = name.len() + value.len();
        if header_bytes + size > MAX_HEADER_BYTES || name.len() > 255 || left_out(name) {
            return;
        }
        header_bytes += size;
        bytes.reserve(3 + size);
        bytes.push(name.len() as u8);
        bytes.extend_from_slice(name.as_bytes());
        bytes.extend_from_slice(&(value.len() as u16).to_le_bytes());
        bytes.extend_from_slice(value);
    });
}

/// Whether the header `name` is left out: it carries credentials (`authorization`,
/// `cookie`, `proxy-authorization`), or what a record keeps already, the request line and
/// client address a proxy sends `/v1/auth` (`x-original-uri`, `x-forwarded-uri`,
/// `x-original-method`, `x-forwarded-method`, `x-real-ip`). Each has a length of its own.
fn left_out(name: &str) -> bool {
    let known = match name.len() {
        6 => "cookie",
        9 => "x-real-ip",
        13 => "authorization",
        14 => "x-original-uri",
        15 => "x-forwarded-uri",
        17 => "x-original-method",
        18 => "x-forwarded-method",
        19 => "proxy-authorization",
        _ => return false,
    };
    name.eq_ignore_ascii_case(known)
}

fn push_str(bytes: &mut Vec<u8>, s: &str) {
    let s = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    bytes.extend_from_slice(&(s.len() as u16).to_le_bytes());
    bytes.extend_from_slice(s);
}

fn decode(at: u64, bytes: &[u8]) -> Option<Recorded> {
    let mut rest = bytes;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = rest.split_at_checked(n)?;
        rest = tail;
        Some(head)
    };
    let len = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
    let method = String::from_utf8_lossy(take(len)?).into_owned();
    let len = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
    let path = String::from_utf8_lossy(take(len)?).into_owned();
    let client_ip = match take(1)?[0] {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(take(4)?).ok()?)),
        6 => Some(IpAddr::from(<[u8; 16]>::try_from(take(16)?).ok()?)),
        _ => None,
    };
    let mut headers = Vec::new();
    while let Some(len) = take(1) {
        let name = String::from_utf8_lossy(take(len[0] as usize)?).to_ascii_lowercase();
        let len = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
        headers.push((name, take(len)?.to_vec()));
    }
    Some(Recorded {
        at,
        method,
        path,
        client_ip,
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(path: &'a str, headers: &'a [(&'a str, &'a [u8])]) -> Request<'a> {
        Request {
            method: "GET",
            path,
            headers,
            client_ip: Some("10.0.0.7".parse().unwrap()),
        }
    }

    fn record(recorder: &mut Recorder, at: u64, request: &Request<'_>) {
        let mut bytes = Vec::new();
        encode(&mut bytes, at, request);
        recorder.push(&bytes);
    }

    fn since(recorder: &Recorder, at: u64) -> Vec<Recorded> {
        read(&recorder.copy(), at)
    }

    #[test]
    fn a_request_comes_back_as_recorded_without_its_secrets() {
        let mut recorder = Recorder::new(1 << 20);
        let headers: [(&str, &[u8]); 5] = [
            ("X-Tenant", b"acme"),
            ("Authorization", b"Bearer secret"),
            ("x-original-uri", b"/v1/items"),
            ("user-agent", b"curl"),
            ("cookie", b"session=1"),
        ];
        record(&mut recorder, 5, &request("/v1/items", &headers));
        let back = since(&recorder, 0);
        assert_eq!(back.len(), 1);
        let r = &back[0];
        assert_eq!(
            (r.at, r.method.as_str(), r.path.as_str()),
            (5, "GET", "/v1/items")
        );
        assert_eq!(r.client_ip, Some("10.0.0.7".parse().unwrap()));
        assert_eq!(
            r.headers,
            [
                ("x-tenant".to_string(), b"acme".to_vec()),
                ("user-agent".to_string(), b"curl".to_vec())
            ]
        );
        assert!(since(&recorder, 6).is_empty());
    }

    #[test]
    fn it_never_holds_more_than_its_budget_and_keeps_the_newest() {
        let budget = 64 * 1024;
        let mut recorder = Recorder::new(budget);
        let allocated = recorder.bytes.capacity();
        let big = vec![b'v'; 4_000];
        for i in 0..10_000u64 {
            let path = format!("/v1/items/{i}");
            let headers: [(&str, &[u8]); 1] = [("x-big", &big[..(i % 4_000) as usize])];
            record(&mut recorder, i, &request(&path, &headers));
            assert!(recorder.held().bytes <= budget);
        }
        let held = recorder.held();
        assert!(held.bytes <= budget && held.requests > 0);
        assert_eq!(held.requests as u64 + held.dropped, 10_000);
        let kept = since(&recorder, 0);
        assert_eq!(held.oldest, Some(kept[0].at));
        assert_eq!(kept.last().unwrap().path, "/v1/items/9999");
        assert!(kept.windows(2).all(|w| w[0].at < w[1].at));
        // Headers beyond the per-request bound are left out, not the request.
        assert!(
            kept.iter()
                .all(|r| r.headers.iter().all(|(_, v)| v.len() <= MAX_HEADER_BYTES))
        );
        // The ring was never reallocated: its memory is what it took at the start.
        assert_eq!(recorder.bytes.capacity(), allocated);
        // A request larger than the whole budget is let go, and nothing else with it.
        let mut tiny = Recorder::new(40);
        record(&mut tiny, 1, &request("/a", &[]));
        record(&mut tiny, 2, &request(&"/long".repeat(20), &[]));
        assert_eq!(since(&tiny, 0).len(), 1);
        assert_eq!(tiny.held().dropped, 1);
    }
}
