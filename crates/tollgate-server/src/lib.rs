//! The tollgate service: rule files (native and Envoy's format), the HTTP API (check, nginx
//! `auth_request`, admin, console, metrics, health), Envoy's rate limit service over gRPC,
//! and hot reload, all over one [`tollgate::Limiter`] on the store the files choose; and the
//! command line that runs it and its tools. Its parts, from the top (each uses only those
//! below it):
//!
//! - [`cli`]: the commands (`serve`, `validate`, `check`, `simulate`, `bench`);
//! - [`provider`]: where the configuration comes from (files, directories, the environment);
//! - [`http`], [`grpc`]: the protocols and their routes; [`envoy`]: what exists because
//!   envoyproxy/ratelimit does; [`net`]: what guards both listeners;
//! - [`service`]: the rules loaded now, the store, the checks every protocol asks for;
//!   [`console`]: what the console keeps; [`shared`]: what instances on one Redis share;
//!   [`metrics`]; [`telemetry`]: logs and traces;
//! - [`config`]: the configuration model both formats produce.

pub mod cli;
pub mod config;
pub mod console;
pub mod envoy;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod net;
pub mod provider;
pub mod service;
pub mod shared;
pub mod telemetry;
