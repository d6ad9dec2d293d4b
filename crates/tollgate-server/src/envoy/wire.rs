//! Bounds on what one `ShouldRateLimit` call may make the service allocate, read off the
//! message's bytes as they arrive, before anything is decoded.
//!
//! A message may be as long as `server.grpc_max_message_bytes` (4 MiB, grpc-go's default and
//! so Envoy's rate limit service's), but its length alone does not bound what decoding it
//! allocates: an empty descriptor is 2 bytes on the wire and about a hundred decoded, so 4 MiB
//! of them would take hundreds of MB. [`Bounded`] counts descriptors and entries in the
//! request body as it streams in and refuses the call (`OUT_OF_RANGE`) at the first one past
//! [`MAX_DESCRIPTORS`] or [`MAX_ENTRIES`], having buffered nothing itself: tonic holds at most
//! the bytes that arrived until then.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use tonic::Status;

/// An error of any kind, as tonic takes a body's.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The most descriptors one request may carry: one batch of the limiter's.
pub const MAX_DESCRIPTORS: usize = tollgate::MAX_BATCH;

/// The most entries all the descriptors of one request may carry together.
pub const MAX_ENTRIES: usize = 16 * 1_024;

/// A resumable scan of the gRPC frames of `RateLimitRequest` messages: counts descriptors
/// (field 2) and their entries (field 1 of a descriptor), skipping every other field's bytes
/// without looking at them. Where the bytes are not a well-formed message it stops counting
/// at that point: decoding fails there too, having decoded only what was counted before it.
#[derive(Debug)]
struct Scan {
    state: State,
    /// Bytes left of the current message.
    message_left: u64,
    /// Inside a descriptor: bytes left of it.
    descriptor_left: Option<u64>,
    /// How deep in groups (wire types 3 and 4) the scan is; nothing in a group is counted,
    /// as nothing in one is decoded.
    groups: u32,
    descriptors: usize,
    entries: usize,
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Reading a frame's 5-byte header: compressed flag and big-endian length.
    Header { read: u8, length: u32 },
    /// Reading a field's tag.
    Tag(Varint),
    /// Reading the length of a length-delimited field.
    Length { field: u64, length: Varint },
    /// Reading a varint field's value.
    Value(Varint),
    /// Skipping this many bytes of a field's value.
    Skip(u64),
    /// Nothing more to count: the frame is compressed or the bytes are not a message.
    Done,
}

/// A varint read a byte at a time.
#[derive(Debug, Clone, Copy, Default)]
struct Varint {
    value: u64,
    shift: u32,
}

impl Varint {
    /// Takes one byte: the value once complete, `Err` when longer than ten bytes.
    fn push(&mut self, byte: u8) -> Result<Option<u64>, ()> {
        if self.shift >= 64 {
            return Err(());
        }
        self.value |= u64::from(byte & 0x7f) << self.shift;
        self.shift += 7;
        Ok((byte & 0x80 == 0).then_some(self.value))
    }
}

impl Scan {
    fn new() -> Self {
        Self {
            state: State::Header { read: 0, length: 0 },
            message_left: 0,
            descriptor_left: None,
            groups: 0,
            descriptors: 0,
            entries: 0,
        }
    }

    /// Takes the next bytes of the body; `Err` once the request carries too many
    /// descriptors or entries.
    fn feed(&mut self, mut bytes: &[u8]) -> Result<(), Status> {
        while !bytes.is_empty() {
            match self.state {
                State::Done => return Ok(()),
                State::Header { read, length } => {
                    let byte = bytes[0];
                    bytes = &bytes[1..];
                    // Byte 0 is the compressed flag, bytes 1 to 4 the length.
                    let length = length << 8 | u32::from(byte);
                    self.state = match read {
                        // Compressed: tonic refuses it, as the service accepts no encoding.
                        0 if byte != 0 => State::Done,
                        0..=3 => State::Header {
                            read: read + 1,
                            length,
                        },
                        _ => {
                            self.message_left = u64::from(length);
                            self.descriptor_left = None;
                            self.groups = 0;
                            self.boundary()
                        }
                    };
                }
                State::Skip(n) => {
                    let k = n.min(bytes.len() as u64);
                    bytes = &bytes[k as usize..];
                    self.state = match self.consume(k) {
                        false => State::Done,
                        true if k == n => self.boundary(),
                        true => State::Skip(n - k),
                    };
                }
                State::Tag(v) | State::Value(v) | State::Length { length: v, .. } => {
                    let byte = bytes[0];
                    bytes = &bytes[1..];
                    let mut v = v;
                    let read = if self.consume(1) {
                        v.push(byte)
                    } else {
                        Err(())
                    };
                    self.state = match (read, self.state) {
                        (Err(()), _) => State::Done,
                        (Ok(None), State::Length { field, .. }) => {
                            State::Length { field, length: v }
                        }
                        (Ok(None), State::Tag(_)) => State::Tag(v),
                        (Ok(None), _) => State::Value(v),
                        (Ok(Some(tag)), State::Tag(_)) => self.tag(tag),
                        (Ok(Some(length)), State::Length { field, .. }) => {
                            self.length_delimited(field, length)?
                        }
                        // A varint field's value, read whole.
                        (Ok(Some(_)), _) => self.boundary(),
                    };
                }
            }
        }
        Ok(())
    }

    /// Counts `n` bytes of the message read; false when they run past the message or the
    /// descriptor being read (not a well-formed message).
    fn consume(&mut self, n: u64) -> bool {
        let Some(left) = self.message_left.checked_sub(n) else {
            return false;
        };
        self.message_left = left;
        match self.descriptor_left.map(|d| d.checked_sub(n)) {
            Some(None) => false,
            Some(Some(d)) => {
                self.descriptor_left = Some(d);
                true
            }
            None => true,
        }
    }

    /// The state between two fields: a descriptor whose bytes are all read is left, and a
    /// message whose bytes are all read is followed by the next frame's header.
    fn boundary(&mut self) -> State {
        if self.descriptor_left == Some(0) {
            self.descriptor_left = None;
        }
        if self.message_left == 0 {
            if self.descriptor_left.is_some() || self.groups > 0 {
                return State::Done;
            }
            return State::Header { read: 0, length: 0 };
        }
        State::Tag(Varint::default())
    }

    fn tag(&mut self, tag: u64) -> State {
        match tag & 7 {
            0 => State::Value(Varint::default()),
            1 => self.skip(8),
            2 => State::Length {
                field: tag >> 3,
                length: Varint::default(),
            },
            3 => {
                self.groups += 1;
                self.boundary()
            }
            4 if self.groups > 0 => {
                self.groups -= 1;
                self.boundary()
            }
            5 => self.skip(4),
            _ => State::Done,
        }
    }

    fn skip(&mut self, n: u64) -> State {
        if n == 0 {
            self.boundary()
        } else {
            State::Skip(n)
        }
    }

    /// A length-delimited field of `length` bytes: a descriptor, an entry, or bytes to skip.
    fn length_delimited(&mut self, field: u64, length: u64) -> Result<State, Status> {
        if length > self.message_left || self.descriptor_left.is_some_and(|d| length > d) {
            return Ok(State::Done);
        }
        if self.groups > 0 {
            return Ok(self.skip(length));
        }
        match (self.descriptor_left, field) {
            (None, 2) => {
                self.descriptors += 1;
                if self.descriptors > MAX_DESCRIPTORS {
                    return Err(Status::out_of_range(format!(
                        "too many descriptors: more than {MAX_DESCRIPTORS} in one request"
                    )));
                }
                if length == 0 {
                    return Ok(self.boundary());
                }
                self.descriptor_left = Some(length);
                Ok(State::Tag(Varint::default()))
            }
            (Some(_), 1) => {
                self.entries += 1;
                if self.entries > MAX_ENTRIES {
                    return Err(Status::out_of_range(format!(
                        "too many descriptor entries: more than {MAX_ENTRIES} in one request"
                    )));
                }
                Ok(self.skip(length))
            }
            _ => Ok(self.skip(length)),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request body whose `RateLimitRequest` is counted as it streams in (see [`Scan`]):
    /// past a bound, it ends in an `OUT_OF_RANGE` status, which tonic answers with.
    #[derive(Debug)]
    pub struct Scanned<B> {
        #[pin]
        body: B,
        scan: Scan,
    }
}

impl<B> Body for Scanned<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        match this.body.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.scan.feed(data.chunk())?;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The rate limit service `S` with its request bodies counted as they arrive (see the module
/// documentation).
#[derive(Debug, Clone)]
pub struct Bounded<S>(pub S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for Bounded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<axum::http::Request<B>> for Bounded<S>
where
    S: tower::Service<axum::http::Request<Scanned<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> S::Future {
        self.0.call(request.map(|body| Scanned {
            body,
            scan: Scan::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::google::protobuf::UInt64Value;
    use proptest::prelude::*;
    use prost::Message;

    fn frame(message: &[u8]) -> Vec<u8> {
        let mut framed = vec![0];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(message);
        framed
    }

    /// Feeds `bytes` cut at every `step` bytes; the counts, or the status.
    fn scan(bytes: &[u8], step: usize) -> Result<(usize, usize), Status> {
        let mut scan = Scan::new();
        for chunk in bytes.chunks(step.max(1)) {
            scan.feed(chunk)?;
        }
        Ok((scan.descriptors, scan.entries))
    }

    fn request() -> impl Strategy<Value = RateLimitRequest> {
        let entry = ("[a-z]{0,3}", ".{0,20}").prop_map(|(key, value)| Entry { key, value });
        let descriptor = (
            prop::collection::vec(entry, 0..5),
            prop::option::of(0u64..1_000),
            any::<bool>(),
            prop::option::of(0u32..100),
        )
            .prop_map(|(entries, hits, negative, limit)| RateLimitDescriptor {
                entries,
                hits_addend: hits.map(|value| UInt64Value { value }),
                is_negative_hits: negative,
                limit: limit.map(|requests_per_unit| RateLimitOverride {
                    requests_per_unit,
                    unit: 2,
                }),
            });
        (
            "[a-z]{0,10}",
            prop::collection::vec(descriptor, 0..20),
            any::<u32>(),
        )
            .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
                domain,
                descriptors,
                hits_addend,
            })
    }

    proptest! {
        /// However the bytes are cut, the scan counts what decoding finds, unknown fields
        /// (a group among them) included.
        #[test]
        fn counts_what_decoding_finds(request in request(), step in 1usize..40, unknown in any::<bool>()) {
            let mut message = Vec::new();
            if unknown {
                // Field 9 as a group holding a length-delimited field 2, then field 10 fixed64.
                message.extend_from_slice(&[0x4b, 0x12, 0x01, 0x00, 0x4c, 0x51]);
                message.extend_from_slice(&[0; 8]);
            }
            request.encode(&mut message).unwrap();
            let decoded = RateLimitRequest::decode(message.as_slice()).unwrap();
            let entries = decoded.descriptors.iter().map(|d| d.entries.len()).sum();
            prop_assert_eq!(scan(&frame(&message), step).unwrap(), (decoded.descriptors.len(), entries));
        }
    }

    #[test]
    fn a_flood_of_empty_descriptors_is_refused_at_the_first_past_the_bound() {
        let message: Vec<u8> = std::iter::repeat_n([0x12, 0x00], 1_900_000)
            .flatten()
            .collect();
        let framed = frame(&message);
        let mut scan = Scan::new();
        let refused = scan
            .feed(&framed[..5 + 2 * (MAX_DESCRIPTORS + 1)])
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::OutOfRange);
        assert!(refused.message().contains("too many descriptors"));
        assert_eq!(scan.descriptors, MAX_DESCRIPTORS + 1);
    }

    #[test]
    fn entries_are_bounded_across_descriptors() {
        let entry = Entry {
            key: String::new(),
            value: String::new(),
        };
        let request = RateLimitRequest {
            descriptors: vec![
                RateLimitDescriptor {
                    entries: vec![entry; MAX_ENTRIES / 2 + 1],
                    ..RateLimitDescriptor::default()
                };
                2
            ],
            ..RateLimitRequest::default()
        };
        let refused = scan(&frame(&request.encode_to_vec()), 4096).unwrap_err();
        assert!(
            refused.message().contains("too many descriptor entries"),
            "{refused}"
        );
    }

    #[test]
    fn long_values_are_skipped_not_read() {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: "x".repeat(1_000_000),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        };
        assert_eq!(
            scan(&frame(&request.encode_to_vec()), 16_384).unwrap(),
            (1, 1)
        );
    }

    #[test]
    fn what_is_not_a_message_stops_the_count_where_decoding_fails() {
        // A descriptor claiming more bytes than the message holds.
        let mut message = vec![0x12, 0x7f];
        message.extend(std::iter::repeat_n([0x12, 0x00], 20).flatten());
        assert!(RateLimitRequest::decode(message.as_slice()).is_err());
        assert_eq!(scan(&frame(&message), 3).unwrap(), (0, 0));
        // A compressed frame is not looked into.
        let mut compressed = frame(&[0x12, 0x00]);
        compressed[0] = 1;
        assert_eq!(scan(&compressed, 1).unwrap(), (0, 0));
        // An end of group with no group open.
        assert_eq!(scan(&frame(&[0x0c, 0x12, 0x00]), 1).unwrap(), (0, 0));
    }
}
