//! Follows the HTTP/1 requests of a connection as its bytes are read, before hyper parses
//! them, far enough to see each request head whole and where the next one begins, for two
//! things hyper does not give the service:
//!
//! - a head with both `Content-Length` and `Transfer-Encoding` is marked, so that the request
//!   can be refused with 400. hyper lets `Transfer-Encoding` win and drops `Content-Length`,
//!   which leaves nothing of the ambiguity for the service to see; a proxy in front that framed
//!   the body by its length would then disagree with this server about where the next request
//!   starts (request smuggling);
//! - whether a head is begun and not yet whole, for the header timeout (see
//!   [`crate::connections`]), without a timer per request.
//!
//! Bounded: a head is kept until it ends, and a head longer than [`MAX_HEAD`] (which hyper
//! refuses too), an HTTP/2 connection, or bytes that are not HTTP/1 stop the following. A
//! head read whole in one piece, the usual case, is scanned where it lies, in one pass.

/// The longest request head followed; hyper is told the same bound.
pub(crate) const MAX_HEAD: usize = 64 * 1024;

/// Where the next bytes of a connection fall.
#[derive(Debug)]
enum State {
    /// Between requests: the next byte begins a head.
    Idle,
    /// In a request head: the bytes so far.
    Head(Vec<u8>),
    /// In a body of this many bytes more.
    Body(u64),
    /// In a chunk's size line: the bytes so far.
    ChunkSize(Vec<u8>),
    /// In a chunk's data, this many bytes more, then its CRLF.
    ChunkData(u64),
    /// The CRLF after a chunk's data: this many bytes more.
    ChunkEnd(u8),
    /// The trailers after the last chunk: the bytes so far.
    Trailers(Vec<u8>),
    /// Not followed any more.
    Off,
}

/// The requests of one connection, as followed so far.
#[derive(Debug)]
pub(crate) struct Framing {
    state: State,
    /// Request heads seen whole.
    heads: u64,
    /// The index (from 0) of the first head with both framings, if any.
    ambiguous: Option<u64>,
}

impl Default for Framing {
    fn default() -> Self {
        Self {
            state: State::Idle,
            heads: 0,
            ambiguous: None,
        }
    }
}

impl Framing {
    /// The index (from 0) of the first request whose head had both `Content-Length` and
    /// `Transfer-Encoding`, if any came yet.
    pub(crate) fn ambiguous(&self) -> Option<u64> {
        self.ambiguous
    }

    /// Whether a request head is begun and not yet whole.
    pub(crate) fn in_head(&self) -> bool {
        matches!(self.state, State::Head(_))
    }

    /// Whether the connection is no longer followed (HTTP/2, or not HTTP).
    pub(crate) fn off(&self) -> bool {
        matches!(self.state, State::Off)
    }

    /// Follows `bytes`, the next ones read from the connection.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let used = match &mut self.state {
                State::Off => return,
                State::Idle => match Head::scan(bytes) {
                    // A whole head in this read, the usual case: scanned in place, once.
                    Some(head) => {
                        self.state = self.after_head(&head);
                        head.end
                    }
                    None => {
                        self.state = State::Head(Vec::new());
                        0
                    }
                },
                State::Head(head) => {
                    let before = head.len();
                    // From the last bytes kept, so that an end split across reads is found,
                    // and each byte is looked at a bounded number of times.
                    let from = before.saturating_sub(2);
                    head.extend_from_slice(bytes);
                    match blank_line(&head[from..]).map(|at| from + at) {
                        Some(end) => {
                            let head = std::mem::take(head);
                            self.state = match Head::scan(&head[..end]) {
                                Some(scanned) => self.after_head(&scanned),
                                None => State::Off,
                            };
                            end - before
                        }
                        None if head.len() > MAX_HEAD => {
                            self.state = State::Off;
                            return;
                        }
                        None => bytes.len(),
                    }
                }
                State::Body(left) => {
                    let used = bytes
                        .len()
                        .min(usize::try_from(*left).unwrap_or(usize::MAX));
                    *left -= used as u64;
                    if *left == 0 {
                        self.state = State::Idle;
                    }
                    used
                }
                State::ChunkSize(line) => {
                    let before = line.len();
                    line.extend_from_slice(bytes);
                    match memchr::memchr(b'\n', line) {
                        Some(at) => {
                            let text = line[..at].strip_suffix(b"\r").unwrap_or(&line[..at]);
                            let size = std::str::from_utf8(text)
                                .ok()
                                .map(|l| l.split(';').next().unwrap_or_default().trim())
                                .and_then(|hex| u64::from_str_radix(hex, 16).ok());
                            self.state = match size {
                                Some(0) => State::Trailers(Vec::new()),
                                Some(size) => State::ChunkData(size),
                                None => State::Off,
                            };
                            at + 1 - before
                        }
                        None if line.len() > 1024 => {
                            self.state = State::Off;
                            return;
                        }
                        None => bytes.len(),
                    }
                }
                State::ChunkData(left) => {
                    let used = bytes
                        .len()
                        .min(usize::try_from(*left).unwrap_or(usize::MAX));
                    *left -= used as u64;
                    if *left == 0 {
                        self.state = State::ChunkEnd(2);
                    }
                    used
                }
                State::ChunkEnd(left) => {
                    let used = bytes.len().min(usize::from(*left));
                    *left -= used as u8;
                    if *left == 0 {
                        self.state = State::ChunkSize(Vec::new());
                    }
                    used
                }
                State::Trailers(trailers) => {
                    let before = trailers.len();
                    trailers.extend_from_slice(bytes);
                    // No trailers: the empty line comes at once.
                    let end = if trailers.starts_with(b"\r\n") {
                        Some(2)
                    } else if trailers.starts_with(b"\n") {
                        Some(1)
                    } else {
                        blank_line(trailers)
                    };
                    match end {
                        Some(end) => {
                            self.state = State::Idle;
                            end - before
                        }
                        None if trailers.len() > MAX_HEAD => {
                            self.state = State::Off;
                            return;
                        }
                        None => bytes.len(),
                    }
                }
            };
            bytes = &bytes[used..];
        }
    }

    /// What follows a request head: its body, by its framing.
    fn after_head(&mut self, head: &Head) -> State {
        let index = self.heads;
        self.heads += 1;
        if !head.http1 {
            // HTTP/2's preface, or not HTTP.
            return State::Off;
        }
        if head.encoded && head.length.is_some() {
            self.ambiguous.get_or_insert(index);
            // The connection is closed after the answer: nothing after counts.
            return State::Off;
        }
        match (head.chunked, head.length) {
            (true, _) => State::ChunkSize(Vec::new()),
            (false, Some(u64::MAX)) => State::Off,
            (false, Some(0) | None) => State::Idle,
            (false, Some(length)) => State::Body(length),
        }
    }
}

/// What the framing needs of a request head.
#[derive(Debug, Default)]
struct Head {
    /// Where it ends: just after its blank line.
    end: usize,
    /// Whether its request line ends in `HTTP/1.1` or `HTTP/1.0`.
    http1: bool,
    /// Its `Content-Length` (`u64::MAX` when not a number).
    length: Option<u64>,
    /// Whether it has `Transfer-Encoding`, and whether that ends in `chunked`.
    encoded: bool,
    chunked: bool,
}

impl Head {
    /// The head at the start of `bytes`, if it ends there: lines end in LF or CRLF, as hyper
    /// reads them, and a blank line ends the head. One pass over the bytes.
    fn scan(bytes: &[u8]) -> Option<Self> {
        let mut head = Self::default();
        let mut start = 0;
        for newline in memchr::memchr_iter(b'\n', bytes) {
            let line = &bytes[start..newline];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if start == 0 {
                head.http1 = line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0");
            } else if line.is_empty() {
                head.end = newline + 1;
                return Some(head);
            } else {
                head.header(line);
            }
            start = newline + 1;
        }
        None
    }

    fn header(&mut self, line: &[u8]) {
        // Only two names matter: skip the others by their first byte.
        if !matches!(line.first(), Some(b'c' | b'C' | b't' | b'T')) {
            return;
        }
        let Some(colon) = memchr::memchr(b':', line) else {
            return;
        };
        let (name, value) = (line[..colon].trim_ascii(), line[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"content-length") {
            let parsed = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
            self.length = Some(parsed.unwrap_or(u64::MAX));
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.encoded = true;
            self.chunked = value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        }
    }
}

/// Where the first blank line of `bytes` ends (a line feed followed by another, or by a
/// carriage return and a line feed), if there is one.
fn blank_line(bytes: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'\n', bytes).find_map(|at| match &bytes[at + 1..] {
        [b'\n', ..] => Some(at + 2),
        [b'\r', b'\n', ..] => Some(at + 3),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `bytes` in pieces of every size from 1 to 7, and whole.
    fn followed(bytes: &[u8]) -> Vec<Option<u64>> {
        (1..8)
            .chain([bytes.len().max(1)])
            .map(|piece| {
                let mut framing = Framing::default();
                for chunk in bytes.chunks(piece) {
                    framing.feed(chunk);
                }
                framing.ambiguous()
            })
            .collect()
    }

    #[test]
    fn a_head_with_both_framings_is_found_however_it_is_read() {
        let both =
            b"POST / HTTP/1.1\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n";
        assert_eq!(followed(both), vec![Some(0); 8]);
        let reversed =
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n";
        assert_eq!(followed(reversed), vec![Some(0); 8]);
        // Lines that end in a bare line feed, as hyper accepts them too.
        let bare = b"GET / HTTP/1.1\nhost: x\n\nPOST / HTTP/1.1\ncontent-length: 4\ntransfer-encoding: chunked\n\n";
        assert_eq!(followed(bare), vec![Some(1); 8]);
    }

    #[test]
    fn bodies_are_skipped_to_the_next_head() {
        let mut requests = Vec::new();
        requests.extend_from_slice(b"POST / HTTP/1.1\r\ncontent-length: 20\r\n\r\n");
        // A body that looks like a head with both framings is a body.
        requests.extend_from_slice(b"transfer-encoding: x");
        requests.extend_from_slice(b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n");
        requests.extend_from_slice(b"5;ext=1\r\nhello\r\n0\r\nx-trailer: 1\r\n\r\n");
        requests.extend_from_slice(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n");
        assert_eq!(followed(&requests), vec![None; 8]);
        // The fourth request is the ambiguous one.
        requests.extend_from_slice(
            b"POST / HTTP/1.1\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n",
        );
        assert_eq!(followed(&requests), vec![Some(3); 8]);
    }

    #[test]
    fn a_head_begun_is_told_apart_from_one_whole() {
        let mut framing = Framing::default();
        assert!(!framing.in_head());
        framing.feed(b"GET / HTTP/1.1\r\nhost:");
        assert!(framing.in_head());
        framing.feed(b" x\r\n\r\n");
        assert!(!framing.in_head());
    }

    #[test]
    fn what_is_not_http1_is_not_followed() {
        let mut framing = Framing::default();
        framing.feed(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        framing.feed(b"content-length: 1\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!(framing.ambiguous(), None);
        assert!(framing.off());
        let mut framing = Framing::default();
        framing.feed(&vec![b'a'; MAX_HEAD + 1]);
        assert!(framing.off());
    }
}
