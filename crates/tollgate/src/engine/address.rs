//! Client addresses as attackers have them: an IPv6 client holds a /64 (or more), so a key of
//! the literal address limits nobody; and the proxies in front of a service come in ranges.
//! Keys group addresses by a prefix per family ([`Prefixes`], IPv6 /64 by default), and the
//! client behind trusted proxies is found from `X-Forwarded-For` ([`client_behind`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// How many leading bits of an address a key keeps, per family: the network a client holds.
/// By default all of an IPv4 address (/32) and the /64 of an IPv6 one, which a single host is
/// routinely given whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefixes {
    /// Bits of an IPv4 address kept: 1 to 32.
    pub v4: u8,
    /// Bits of an IPv6 address kept: 1 to 128.
    pub v6: u8,
}

impl Default for Prefixes {
    fn default() -> Self {
        Self { v4: 32, v6: 64 }
    }
}

impl Prefixes {
    /// Checks both lengths.
    ///
    /// # Errors
    /// A message naming the family whose length is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=32).contains(&self.v4) {
            return Err(format!("v4={}: must be 1 to 32", self.v4));
        }
        if !(1..=128).contains(&self.v6) {
            return Err(format!("v6={}: must be 1 to 128", self.v6));
        }
        Ok(())
    }

    /// The network of `ip` these prefixes keep, as a key part: the address itself when all of
    /// it is kept (`203.0.113.7`), else the network and its length (`2001:db8:1:2::/64`).
    /// An IPv4 address mapped into IPv6 counts as IPv4.
    pub fn network(&self, ip: IpAddr) -> String {
        match canonical(ip) {
            IpAddr::V4(v4) if self.v4 >= 32 => v4.to_string(),
            IpAddr::V4(v4) => format!("{}/{}", mask_v4(v4, self.v4), self.v4),
            IpAddr::V6(v6) if self.v6 >= 128 => v6.to_string(),
            IpAddr::V6(v6) => format!("{}/{}", mask_v6(v6, self.v6), self.v6),
        }
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn mask_v4(ip: Ipv4Addr, bits: u8) -> Ipv4Addr {
    let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
    Ipv4Addr::from(u32::from(ip) & mask)
}

fn mask_v6(ip: Ipv6Addr, bits: u8) -> Ipv6Addr {
    let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
    Ipv6Addr::from(u128::from(ip) & mask)
}

/// A range of addresses, `10.0.0.0/8` or `2001:db8::/32`; an address alone is a range of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpRange {
    network: IpAddr,
    bits: u8,
}

impl IpRange {
    /// The addresses that share `ip`'s first `bits` bits.
    ///
    /// # Errors
    /// A message when `bits` is longer than the address.
    pub fn new(ip: IpAddr, bits: u8) -> Result<Self, String> {
        let ip = canonical(ip);
        let network = match ip {
            IpAddr::V4(v4) if bits <= 32 => IpAddr::V4(mask_v4(v4, bits)),
            IpAddr::V6(v6) if bits <= 128 => IpAddr::V6(mask_v6(v6, bits)),
            _ => return Err(format!("/{bits} is longer than the address {ip}")),
        };
        Ok(Self { network, bits })
    }

    /// Whether `ip` is in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(v4)) => mask_v4(v4, self.bits) == net,
            (IpAddr::V6(net), IpAddr::V6(v6)) => mask_v6(v6, self.bits) == net,
            _ => false,
        }
    }
}

impl From<IpAddr> for IpRange {
    fn from(ip: IpAddr) -> Self {
        let ip = canonical(ip);
        let bits = if ip.is_ipv4() { 32 } else { 128 };
        Self { network: ip, bits }
    }
}

impl FromStr for IpRange {
    type Err = String;

    /// `10.0.0.0/8`, `2001:db8::/32`, or an address alone.
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not an address or a range (`10.0.0.0/8`, `::1`)");
        match text.trim().split_once('/') {
            None => text
                .trim()
                .parse::<IpAddr>()
                .map(Self::from)
                .map_err(|_| bad()),
            Some((ip, bits)) => {
                let ip: IpAddr = ip.parse().map_err(|_| bad())?;
                let bits: u8 = bits.parse().map_err(|_| bad())?;
                Self::new(ip, bits).map_err(|e| format!("`{text}`: {e}"))
            }
        }
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.bits)
    }
}

/// The client of a request that reached `peer`: `peer` itself, or, when `peer` is in one of
/// the `trusted` ranges, the right-most address of `X-Forwarded-For` (its values in order,
/// each a comma-separated list of hops) that is not itself trusted. A hop that is not an
/// address ends what can be believed: the last trusted hop before it is the client.
pub fn client_behind<'a>(
    peer: IpAddr,
    forwarded_for: impl IntoIterator<Item = &'a str>,
    trusted: &[IpRange],
) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|r| r.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let hops: Vec<&str> = forwarded_for
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let mut client = peer;
    for hop in hops.iter().rev() {
        match hop.parse::<IpAddr>() {
            Ok(ip) if is_trusted(ip) => client = ip,
            Ok(ip) => return ip,
            Err(_) => break,
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn keys_keep_an_ipv6_clients_64_and_an_ipv4_address_whole() {
        let p = Prefixes::default();
        assert_eq!(p.network(ip("203.0.113.7")), "203.0.113.7");
        assert_eq!(p.network(ip("2001:db8:1:2:aaaa::1")), "2001:db8:1:2::/64");
        assert_eq!(p.network(ip("2001:db8:1:2:ffff::9")), "2001:db8:1:2::/64");
        assert_ne!(
            p.network(ip("2001:db8:1:3::1")),
            p.network(ip("2001:db8:1:2::1"))
        );
        assert_eq!(p.network(ip("::ffff:203.0.113.7")), "203.0.113.7");
        let wide = Prefixes { v4: 24, v6: 48 };
        assert_eq!(wide.network(ip("203.0.113.7")), "203.0.113.0/24");
        assert_eq!(wide.network(ip("2001:db8:1:2::1")), "2001:db8:1::/48");
        assert!(Prefixes { v4: 0, v6: 64 }.validate().is_err());
        assert!(Prefixes { v4: 32, v6: 129 }.validate().is_err());
    }

    #[test]
    fn ranges_parse_and_contain() {
        let lan: IpRange = "10.0.0.0/8".parse().unwrap();
        assert!(lan.contains(ip("10.200.1.1")) && !lan.contains(ip("11.0.0.1")));
        let v6: IpRange = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")) && !v6.contains(ip("2001:db9::1")));
        let one: IpRange = "::1".parse().unwrap();
        assert!(one.contains(ip("::1")) && !one.contains(ip("::2")));
        assert!(
            lan.contains(ip("::ffff:10.1.1.1")),
            "a mapped address is IPv4"
        );
        for bad in ["10.0.0.0/33", "nope", "10.0.0.0/x", "::/129"] {
            assert!(bad.parse::<IpRange>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_client_behind_trusted_ranges_is_the_right_most_untrusted_hop() {
        let trusted: Vec<IpRange> = ["10.0.0.0/8", "2001:db8::/32"]
            .iter()
            .map(|r| r.parse().unwrap())
            .collect();
        let behind =
            |peer: &str, xff: &[&str]| client_behind(ip(peer), xff.iter().copied(), &trusted);
        // From a trusted balancer: the hop before it.
        assert_eq!(
            behind("10.1.1.1", &["198.51.100.9, 10.2.2.2"]),
            ip("198.51.100.9")
        );
        // A client's own forged hops to the left are not believed.
        assert_eq!(
            behind("10.1.1.1", &["1.2.3.4, 198.51.100.9"]),
            ip("198.51.100.9")
        );
        // Several header values, in order.
        assert_eq!(
            behind("2001:db8::1", &["203.0.113.5", "10.3.3.3"]),
            ip("203.0.113.5")
        );
        // Not from a trusted peer: the peer, whatever the header says.
        assert_eq!(behind("198.51.100.1", &["1.2.3.4"]), ip("198.51.100.1"));
        // A hop that is not an address ends the walk at the last trusted one.
        assert_eq!(
            behind("10.1.1.1", &["198.51.100.9, junk, 10.2.2.2"]),
            ip("10.2.2.2")
        );
        // Every hop trusted: the left-most.
        assert_eq!(behind("10.1.1.1", &["10.9.9.9"]), ip("10.9.9.9"));
    }
}
