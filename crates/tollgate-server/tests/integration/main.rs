//! The service's integration tests, one binary: a module per subject, most of them against
//! the real `tollgate serve` that `support` starts on free loopback ports; `harness`,
//! `reference`, `browser` and `xds_server` are what several of them share.

mod browser;
mod harness;
mod reference;
mod support;
mod xds_server;

mod bench;
mod configuration;
mod console;
mod denied_cache;
mod deploy;
mod envoy;
mod envoy_compat;
mod envoy_gateway;
mod envoy_settings;
mod envoy_settings_reference;
mod fuzzed;
mod hostile;
mod http;
mod image;
mod layout;
mod lists;
mod llm_proxy;
mod metered;
mod metrics_reference;
mod mutated;
mod nginx;
mod openapi;
mod overrides;
mod permits;
mod redis;
mod regions;
mod reload;
mod simulate;
mod sockets;
mod tls;
mod traces;
mod validate;
mod xds;
