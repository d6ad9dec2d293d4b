//! Follows the HTTP/1 requests of a connection as its bytes are read, before hyper parses
//! them, far enough to see each request head whole and where the next one begins: a head
//! with both `Content-Length` and `Transfer-Encoding` is marked, so that the request can be
//! refused with 400. hyper itself lets `Transfer-Encoding` win and drops `Content-Length`,
//! which leaves nothing of the ambiguity for the service to see; a proxy in front that framed
//! the body by its length would then disagree with this server about where the next request
//! starts (request smuggling).
//!
//! Bounded: a head is kept until it ends, and a head longer than [`MAX_HEAD`] (which hyper
//! refuses too), an HTTP/2 connection, or bytes that are not HTTP/1 stop the following.

/// The longest request head followed; hyper is told the same bound.
pub(crate) const MAX_HEAD: usize = 64 * 1024;

/// Where the next bytes of a connection fall.
#[derive(Debug)]
enum State {
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
            state: State::Head(Vec::new()),
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

    /// Follows `bytes`, the next ones read from the connection.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let used = match &mut self.state {
                State::Off => return,
                State::Head(head) => {
                    let before = head.len();
                    // From the last bytes kept, so that a CRLF CRLF split across reads ends it.
                    let from = before.saturating_sub(3);
                    head.extend_from_slice(bytes);
                    match find(&head[from..], b"\r\n\r\n") {
                        Some(at) => {
                            let end = from + at + 4;
                            let used = end - before;
                            let head = std::mem::take(head);
                            self.state = self.after_head(&head[..end]);
                            used
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
                        self.state = State::Head(Vec::new());
                    }
                    used
                }
                State::ChunkSize(line) => {
                    line.extend_from_slice(bytes);
                    match find(line, b"\r\n") {
                        Some(at) => {
                            let used = bytes.len() - (line.len() - at - 2);
                            let size = std::str::from_utf8(&line[..at])
                                .ok()
                                .map(|l| l.split(';').next().unwrap_or_default().trim())
                                .and_then(|hex| u64::from_str_radix(hex, 16).ok());
                            self.state = match size {
                                Some(0) => State::Trailers(Vec::new()),
                                Some(size) => State::ChunkData(size),
                                None => State::Off,
                            };
                            used
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
                    } else {
                        find(trailers, b"\r\n\r\n").map(|at| at + 4)
                    };
                    match end {
                        Some(end) => {
                            self.state = State::Head(Vec::new());
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
    fn after_head(&mut self, head: &[u8]) -> State {
        let index = self.heads;
        self.heads += 1;
        let Ok(head) = std::str::from_utf8(head) else {
            return State::Off;
        };
        let request_line = head.split("\r\n").next().unwrap_or_default();
        if !request_line.ends_with(" HTTP/1.1") && !request_line.ends_with(" HTTP/1.0") {
            // HTTP/2's preface, or not HTTP.
            return State::Off;
        }
        let (mut length, mut chunked, mut encoded) = (None, false, false);
        for line in head.split("\r\n").skip(1) {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let name = name.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse::<u64>().ok().or(Some(u64::MAX));
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                encoded = true;
                chunked = value
                    .rsplit(',')
                    .next()
                    .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
            }
        }
        if encoded && length.is_some() {
            self.ambiguous.get_or_insert(index);
            // The connection is closed after the answer: nothing after counts.
            return State::Off;
        }
        match (chunked, length) {
            (true, _) => State::ChunkSize(Vec::new()),
            (false, Some(u64::MAX)) => State::Off,
            (false, Some(0) | None) => State::Head(Vec::new()),
            (false, Some(length)) => State::Body(length),
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `bytes` in pieces of every size from 1 to 7.
    fn followed(bytes: &[u8]) -> Vec<Option<u64>> {
        (1..8)
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
        assert_eq!(followed(both), vec![Some(0); 7]);
        let reversed =
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n";
        assert_eq!(followed(reversed), vec![Some(0); 7]);
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
        assert_eq!(followed(&requests), vec![None; 7]);
        // The fourth request is the ambiguous one.
        requests.extend_from_slice(
            b"POST / HTTP/1.1\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n",
        );
        assert_eq!(followed(&requests), vec![Some(3); 7]);
    }

    #[test]
    fn what_is_not_http1_is_not_followed() {
        let mut framing = Framing::default();
        framing.feed(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        framing.feed(b"content-length: 1\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!(framing.ambiguous(), None);
        let mut framing = Framing::default();
        framing.feed(&vec![b'a'; MAX_HEAD + 1]);
        assert!(matches!(framing.state, State::Off));
    }
}
