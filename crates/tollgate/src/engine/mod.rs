//! The rule engine: turns a request into the (rule, key) items a [`Limiter`](crate::Limiter)
//! decides. Two ways in, one way out:
//!
//! - a [`Route`] matches an HTTP request (methods, a path pattern, headers) and builds its
//!   counter key from parts of it (a tenant header, a path segment, the method, the route, the
//!   client address);
//! - a [`Domain`] holds Envoy's rate limit descriptors, the tree of the Envoy ratelimit
//!   service's configuration, and finds the limit of each descriptor a proxy sends.
//!
//! The engine does no I/O and keeps no state: it is rebuilt on every reload and shared by
//! readers. Counter keys are length-prefixed parts, so no value can forge another's key.

mod address;
mod descriptors;
mod pattern;

use std::collections::HashMap;
use std::net::IpAddr;

pub use address::{IpRange, Prefixes, client_behind};
pub use descriptors::{
    Descriptor, DescriptorHit, Domain, DomainBuilder, Entry, LimitOverride, Node, NodeLimit,
    descriptor,
};
pub use pattern::PathPattern;

use crate::limiter::Item;
use crate::rule::Rule;

/// An HTTP request as the engine sees it; its headers are (name, value) pairs or any other
/// [`Headers`], such as an `http::HeaderMap` (feature `tower`), read where they are.
#[derive(Debug)]
pub struct Request<'a, H: Headers + ?Sized = [(&'a str, &'a [u8])]> {
    /// The method, e.g. `GET` (compared without regard to case).
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The headers.
    pub headers: &'a H,
    /// The client's address, when known.
    pub client_ip: Option<IpAddr>,
}

impl<H: Headers + ?Sized> Clone for Request<'_, H> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<H: Headers + ?Sized> Copy for Request<'_, H> {}

/// A request's headers, as the engine reads them.
pub trait Headers {
    /// The first value of the header `name` (given in lowercase; names compare without
    /// regard to case).
    fn get(&self, name: &str) -> Option<&[u8]>;

    /// Calls `f` with each header's name and value, in order (to record a request). None by
    /// default.
    fn each(&self, _f: &mut dyn FnMut(&str, &[u8])) {}
}

impl Headers for [(&str, &[u8])] {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }

    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) {
        for (name, value) in self {
            f(name, value);
        }
    }
}

impl<const N: usize> Headers for [(&str, &[u8]); N] {
    fn get(&self, name: &str) -> Option<&[u8]> {
        Headers::get(&self[..], name)
    }

    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) {
        Headers::each(&self[..], f);
    }
}

impl Headers for Vec<(&str, &[u8])> {
    fn get(&self, name: &str) -> Option<&[u8]> {
        Headers::get(&self[..], name)
    }

    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) {
        Headers::each(&self[..], f);
    }
}

#[cfg(feature = "tower")]
impl Headers for http::HeaderMap {
    fn get(&self, name: &str) -> Option<&[u8]> {
        http::HeaderMap::get(self, name).map(http::HeaderValue::as_bytes)
    }

    fn each(&self, f: &mut dyn FnMut(&str, &[u8])) {
        for (name, value) in self {
            f(name.as_str(), value.as_bytes());
        }
    }
}

/// What a route requires of a request; every condition given must hold.
#[derive(Debug, Clone, Default)]
pub struct Match {
    /// Methods in uppercase; empty: any.
    pub methods: Vec<String>,
    /// The path pattern; `None`: any path.
    pub path: Option<PathPattern>,
    /// Headers that must be present, with the value given when there is one (a value ending
    /// in `*` matches as a prefix).
    pub headers: Vec<(String, Option<String>)>,
}

impl Match {
    fn matches<'r, H: Headers + ?Sized>(
        &self,
        request: &Request<'r, H>,
    ) -> Option<Vec<(&str, &'r str)>> {
        if !self.methods.is_empty()
            && !self
                .methods
                .iter()
                .any(|m| m.eq_ignore_ascii_case(request.method))
        {
            return None;
        }
        for (name, value) in &self.headers {
            let found = request.headers.get(name)?;
            if let Some(value) = value {
                let ok = match value.strip_suffix('*') {
                    Some(prefix) => found.starts_with(prefix.as_bytes()),
                    None => found == value.as_bytes(),
                };
                if !ok {
                    return None;
                }
            }
        }
        match &self.path {
            Some(pattern) => pattern.matches(request.path),
            None => Some(Vec::new()),
        }
    }
}

/// One part of a route's counter key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// The request's method, in uppercase.
    Method,
    /// The route's path pattern as written (the endpoint without its variables).
    Route,
    /// A named segment of the path pattern.
    Segment(String),
    /// A header's value (empty when absent: requests without it share one counter).
    Header(String),
    /// The client's network: its address grouped by [`Prefixes`] (an IPv6 client's /64 by
    /// default); empty when unknown.
    ClientIp(Prefixes),
    /// Fixed text.
    Text(String),
}

impl KeyPart {
    /// Parses `method`, `route`, `client_ip` (or `client_ip(v4=24, v6=48)`: the prefix kept
    /// per family), `segment:NAME`, `header:NAME` or `text:VALUE`.
    ///
    /// # Errors
    /// A message naming what is accepted.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(args) = text
            .strip_prefix("client_ip(")
            .and_then(|rest| rest.strip_suffix(')'))
        {
            let mut prefixes = Prefixes::default();
            let args = args.split([',', ' ']).map(str::trim);
            for arg in args.filter(|a| !a.is_empty()) {
                let bad = || {
                    format!("`{text}`: expected client_ip(v4=BITS, v6=BITS), e.g. client_ip(v6=48)")
                };
                let (family, bits) = arg.split_once('=').ok_or_else(bad)?;
                let bits: u8 = bits.trim().parse().map_err(|_| bad())?;
                match family.trim() {
                    "v4" => prefixes.v4 = bits,
                    "v6" => prefixes.v6 = bits,
                    _ => return Err(bad()),
                }
            }
            prefixes.validate().map_err(|e| format!("`{text}`: {e}"))?;
            return Ok(Self::ClientIp(prefixes));
        }
        let cut = text.ends_with(')') && text.contains('=') && !text.contains(':');
        if text.starts_with("client_ip(") || cut {
            return Err(format!(
                "`{text}`: a part cut at a comma? In a list written [a, b], quote a part that \
                 holds one: \"client_ip(v4=24, v6=48)\", or separate with a space"
            ));
        }
        Ok(match text.split_once(':') {
            None if text == "method" => Self::Method,
            None if text == "route" => Self::Route,
            None if text == "client_ip" => Self::ClientIp(Prefixes::default()),
            Some(("segment", name)) if !name.is_empty() => Self::Segment(name.into()),
            Some(("header", name)) if !name.is_empty() => Self::Header(name.to_ascii_lowercase()),
            Some(("text", value)) => Self::Text(value.into()),
            _ => {
                return Err(format!(
                    "unknown key part `{text}`: expected method, route, client_ip, \
                     client_ip(v4=BITS, v6=BITS), segment:NAME, header:NAME or text:VALUE"
                ));
            }
        })
    }
}

/// A rule applied to the HTTP requests it matches, keyed by parts of them.
#[derive(Debug, Clone)]
pub struct Route {
    /// The rule: its name is the route's id.
    pub rule: Rule,
    /// Whether the route applies; a disabled route is kept (to list and to enable) but matches
    /// nothing.
    pub enabled: bool,
    /// Which requests it applies to.
    pub matcher: Match,
    /// The counter key: these parts of the request, in order.
    pub key: Vec<KeyPart>,
}

impl Route {
    /// Checks that every `segment:` key part names a segment of the path pattern.
    ///
    /// # Errors
    /// A message naming the part.
    pub fn validate(&self) -> Result<(), String> {
        for part in &self.key {
            if let KeyPart::Segment(name) = part {
                let named = self.matcher.path.as_ref().is_some_and(|p| p.names(name));
                if !named {
                    return Err(format!(
                        "key part `segment:{name}` names no `{{{name}}}` of the path pattern"
                    ));
                }
            }
        }
        Ok(())
    }

    fn key<H: Headers + ?Sized>(
        &self,
        request: &Request<'_, H>,
        named: &[(&str, &str)],
    ) -> Vec<u8> {
        let mut key = Vec::new();
        for part in &self.key {
            let upper;
            let ip;
            let value: &[u8] = match part {
                KeyPart::Method => {
                    upper = request.method.to_ascii_uppercase();
                    upper.as_bytes()
                }
                KeyPart::Route => self
                    .matcher
                    .path
                    .as_ref()
                    .map_or(&b"*"[..], |p| p.as_str().as_bytes()),
                KeyPart::Segment(name) => named
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or(&b""[..], |(_, v)| v.as_bytes()),
                KeyPart::Header(name) => request.headers.get(name).unwrap_or_default(),
                KeyPart::ClientIp(prefixes) => {
                    ip = request
                        .client_ip
                        .map(|a| prefixes.network(a))
                        .unwrap_or_default();
                    ip.as_bytes()
                }
                KeyPart::Text(text) => text.as_bytes(),
            };
            push_part(&mut key, value);
        }
        key
    }
}

/// Appends one length-prefixed part to a counter key.
pub(crate) fn push_part(key: &mut Vec<u8>, part: &[u8]) {
    key.extend_from_slice(part.len().to_string().as_bytes());
    key.push(b':');
    key.extend_from_slice(part);
}

/// A (rule, key) pair the engine found for a request, to check with a cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// The rule's name.
    pub rule: &'static str,
    /// The counter key.
    pub key: Vec<u8>,
}

impl Hit {
    /// This hit as an item of a batch of `cost`.
    pub fn item(&self, cost: u64) -> Item<'_> {
        Item::new(self.rule, &self.key, cost)
    }
}

/// A request's hits as the items of one batch, `cost` permits each; dereferences to the
/// items. One hit, the common case, takes no vector.
#[derive(Debug)]
pub enum Items<'a> {
    /// The only hit.
    One([Item<'a>; 1]),
    /// None, or several.
    Many(Vec<Item<'a>>),
}

impl<'a> Items<'a> {
    /// The items of `hits`, `cost` permits each.
    pub fn of(hits: &'a [Hit], cost: u64) -> Self {
        match hits {
            [hit] => Self::One([hit.item(cost)]),
            hits => Self::Many(hits.iter().map(|h| h.item(cost)).collect()),
        }
    }
}

impl<'a> std::ops::Deref for Items<'a> {
    type Target = [Item<'a>];

    fn deref(&self) -> &[Item<'a>] {
        match self {
            Self::One(one) => one,
            Self::Many(many) => many,
        }
    }
}

/// Routes and domains, ready to match requests; see the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Engine {
    routes: Vec<Route>,
    domains: HashMap<String, Domain>,
}

impl Engine {
    /// An engine of `routes` and `domains`.
    ///
    /// # Errors
    /// A message when two routes, or a route and a descriptor, share a rule name, when two
    /// domains share a name, or when a route is invalid (see [`Route::validate`]).
    pub fn new(routes: Vec<Route>, domains: Vec<Domain>) -> Result<Self, String> {
        let mut names = HashMap::new();
        for route in &routes {
            route
                .validate()
                .map_err(|e| format!("rule `{}`: {e}", route.rule.name()))?;
            if names.insert(route.rule.name(), ()).is_some() {
                return Err(format!("two rules have the id `{}`", route.rule.name()));
            }
        }
        let mut by_name = HashMap::new();
        for domain in domains {
            for rule in domain.rules() {
                if names.insert(rule.name(), ()).is_some() {
                    return Err(format!("two rules are named `{}`", rule.name()));
                }
            }
            let name = domain.name().to_string();
            if by_name.insert(name.clone(), domain).is_some() {
                return Err(format!("duplicate domain `{name}`"));
            }
        }
        Ok(Self {
            routes,
            domains: by_name,
        })
    }

    /// Every rule of every route and domain: what a limiter for this engine must hold.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.routes
            .iter()
            .map(|r| &r.rule)
            .chain(self.domains.values().flat_map(Domain::rules))
    }

    /// The routes, in order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The domain named `name`.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// The domains.
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }

    /// The (rule, key) of every enabled route that matches `request`, in route order.
    pub fn hits<H: Headers + ?Sized>(&self, request: &Request<'_, H>) -> Vec<Hit> {
        self.routes
            .iter()
            .filter(|r| r.enabled)
            .filter_map(|route| {
                let named = route.matcher.matches(request)?;
                Some(Hit {
                    rule: route.rule.name(),
                    key: route.key(request, &named),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, Tier};
    use std::time::Duration;

    fn route(id: &str, methods: &[&str], path: &str, key: &[&str]) -> Route {
        Route {
            rule: Rule::new(
                id,
                Algorithm::FixedWindow,
                [Tier::new(10, Duration::from_secs(10))],
            )
            .unwrap(),
            enabled: true,
            matcher: Match {
                methods: methods.iter().map(|m| m.to_string()).collect(),
                path: Some(PathPattern::parse(path).unwrap()),
                headers: Vec::new(),
            },
            key: key.iter().map(|k| KeyPart::parse(k).unwrap()).collect(),
        }
    }

    fn request<'a>(
        method: &'a str,
        path: &'a str,
        headers: &'a [(&'a str, &'a [u8])],
    ) -> Request<'a> {
        Request {
            method,
            path,
            headers,
            client_ip: None,
        }
    }

    #[test]
    fn routes_match_by_method_and_path_and_key_by_parts() {
        let engine = Engine::new(
            vec![
                route(
                    "get",
                    &["GET"],
                    "/orgs/{org}/product/*",
                    &["segment:org", "route", "method"],
                ),
                route("put", &["PUT"], "/orgs/{org}/product/*", &["segment:org"]),
            ],
            Vec::new(),
        )
        .unwrap();
        let hits = engine.hits(&request("get", "/orgs/acme/product/1", &[]));
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].rule, "get");
        assert_eq!(hits[0].key, b"4:acme21:/orgs/{org}/product/*3:GET");
        assert!(
            engine
                .hits(&request("POST", "/orgs/acme/product/1", &[]))
                .is_empty()
        );
        assert_eq!(
            engine.hits(&request("PUT", "/orgs/a/product/1", &[]))[0].key,
            b"1:a"
        );
    }

    #[test]
    fn keys_cannot_be_forged_across_parts() {
        let r = route("h", &[], "/**", &["header:a", "header:b"]);
        let one = [("a", &b"x1:y"[..]), ("b", &b""[..])];
        let two = [("a", &b"x"[..]), ("b", &b"y"[..])];
        let (one, two) = (request("GET", "/", &one), request("GET", "/", &two));
        assert_ne!(r.key(&one, &[]), r.key(&two, &[]));
    }

    #[test]
    fn headers_condition_and_disabled_routes() {
        let mut r = route("h", &[], "/**", &["header:x-org"]);
        r.matcher.headers = vec![("x-plan".into(), Some("free*".into()))];
        let mut off = route("off", &[], "/**", &[]);
        off.enabled = false;
        let engine = Engine::new(vec![r, off], Vec::new()).unwrap();
        let free = [("X-Plan", &b"free-tier"[..])];
        let paid = [("x-plan", &b"paid"[..])];
        assert_eq!(engine.hits(&request("GET", "/a", &free)).len(), 1);
        assert!(engine.hits(&request("GET", "/a", &paid)).is_empty());
        assert!(engine.hits(&request("GET", "/a", &[])).is_empty());
    }

    #[test]
    fn bad_routes_are_refused() {
        let r = route("a", &[], "/x/{org}", &["segment:tenant"]);
        assert!(
            Engine::new(vec![r], Vec::new())
                .unwrap_err()
                .contains("segment:tenant")
        );
        let twice = vec![route("a", &[], "/", &[]), route("a", &[], "/", &[])];
        assert!(
            Engine::new(twice, Vec::new())
                .unwrap_err()
                .contains("two rules")
        );
        assert!(
            KeyPart::parse("tenant")
                .unwrap_err()
                .contains("unknown key part")
        );
    }
}
