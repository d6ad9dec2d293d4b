//! Everything that exists because envoyproxy/ratelimit does: its file format ([`file`](mod@file)), its
//! environment settings ([`settings`], every one of them in [`catalog`]), its answer to descriptors ([`answer`]) over gRPC
//! ([`rls`]) and `POST /json` ([`json`]), its local cache of descriptors over their limit
//! ([`over_cache`]), its statsd sink ([`statsd`]) and its debug listener ([`debug`]); and the
//! bounds on what one gRPC message may make the service allocate ([`wire`]).

pub mod answer;
pub mod catalog;
pub mod debug;
pub mod file;
pub mod json;
pub mod over_cache;
pub mod rls;
pub mod settings;
pub mod statsd;
pub mod wire;

pub use answer::{DescriptorOutcome, Envoy, EnvoyAnswer};
