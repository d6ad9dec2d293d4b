//! The tollgate service: rule files (native and Envoy's format), the HTTP API (check, nginx
//! `auth_request`, admin, metrics, health), Envoy's rate limit service over gRPC, and hot
//! reload, all over one [`tollgate::Limiter`] on the store the files choose; and the load a
//! deployment is benchmarked with. The `tollgate` binary runs it.

pub mod admin;
pub mod bench;
pub mod config;
pub mod connections;
pub mod console;
pub mod debug;
pub mod envoy_json;
mod framing;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod over_cache;
pub mod serve;
pub mod service;
pub mod shared;
pub mod simulate;
pub mod statsd;
pub mod tls;
