//! What guards both listeners: connections bounded in number and time ([`connections`]),
//! HTTP/1 heads followed to enforce the header timeout and refuse ambiguous framing
//! (`framing.rs`), and TLS ([`tls`]).

pub mod connections;
pub(crate) mod framing;
pub mod tls;
