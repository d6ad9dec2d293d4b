//! The impact preview: the requests recorded lately, replayed through a proposed rule on a
//! simulated clock (the `simulate` engine's way: a memory store and a manual clock set to each
//! arrival, no waiting), saying how many it would have admitted and denied, which keys it
//! would have denied most, and, second by second, what was offered and what it admitted.
//! Nothing of the running service is touched.

use std::collections::HashMap;

use serde::Serialize;
use tollgate::engine::{Engine, Request};
use tollgate::{Item, Limiter, ManualClock};

use super::recorder::Recorded;
use crate::config::RuleSpec;

/// What a proposed rule would have done to the traffic recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Preview {
    /// The first and last arrival replayed (seconds since the epoch); 0 when none.
    pub from: u64,
    /// The last.
    pub to: u64,
    /// Requests recorded in the span.
    pub requests: usize,
    /// Of them, those the rule matches.
    pub matched: usize,
    /// Of those, admitted.
    pub admitted: usize,
    /// Of those, denied (in shadow mode too: what enforcing it would deny).
    pub denied: usize,
    /// The keys it would have denied most, with how many of their requests.
    pub denied_keys: Vec<(String, usize)>,
    /// Per second of the span: (second, offered, admitted).
    pub seconds: Vec<(u64, usize, usize)>,
}

/// Replays `recorded` (oldest first) through `spec`, enforced and enabled.
///
/// # Errors
/// The rule's own error, when it cannot be built.
pub fn replay(spec: &RuleSpec, recorded: &[Recorded]) -> Result<Preview, String> {
    let mut spec = spec.clone();
    spec.enabled = true;
    spec.shadow = false;
    let route = spec.route()?;
    let rule = route.rule.clone();
    let engine = Engine::new(vec![route], Vec::new())?;
    let clock = ManualClock::at_micros(recorded.first().map_or(1, |r| r.at.max(1)));
    let limiter = Limiter::builder(rule)
        .clock(clock.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let mut preview = Preview {
        from: recorded.first().map_or(0, |r| r.at / 1_000_000),
        to: recorded.last().map_or(0, |r| r.at / 1_000_000),
        requests: recorded.len(),
        matched: 0,
        admitted: 0,
        denied: 0,
        denied_keys: Vec::new(),
        seconds: Vec::new(),
    };
    let mut denied_keys: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut per_second: Vec<(u64, usize, usize)> = Vec::new();
    for r in recorded {
        let headers = r.headers();
        let request = Request {
            method: &r.method,
            path: &r.path,
            headers: &headers[..],
            client_ip: r.client_ip,
        };
        let hits = engine.hits(&request);
        let Some(hit) = hits.first() else {
            continue;
        };
        clock.set_micros(r.at.max(1));
        let admitted = match limiter.check_batch_now(&[Item::new(hit.rule, &hit.key, 1)]) {
            Ok(decisions) => decisions.allowed(),
            Err(_) => continue,
        };
        preview.matched += 1;
        let second = r.at / 1_000_000;
        match per_second.last_mut() {
            Some((at, offered, admits)) if *at == second => {
                *offered += 1;
                *admits += usize::from(admitted);
            }
            _ => per_second.push((second, 1, usize::from(admitted))),
        }
        if admitted {
            preview.admitted += 1;
        } else {
            preview.denied += 1;
            *denied_keys.entry(hit.key.clone()).or_default() += 1;
        }
    }
    let mut keys: Vec<(String, usize)> = denied_keys
        .into_iter()
        .map(|(k, n)| (super::readable(&k), n))
        .collect();
    keys.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    keys.truncate(20);
    preview.denied_keys = keys;
    preview.seconds = per_second;
    Ok(preview)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_rule_spec;

    fn arrival(at: u64, tenant: &str) -> Recorded {
        Recorded {
            at,
            method: "GET".into(),
            path: "/api/items".into(),
            client_ip: None,
            headers: vec![("x-tenant".into(), tenant.as_bytes().to_vec())],
        }
    }

    #[test]
    fn a_tighter_limit_denies_what_the_recorded_traffic_would_exceed() {
        let t0 = 1_700_006_400_000_000;
        // In one second: acme sends 5, globex 2; a second later acme sends 1 more.
        let mut recorded: Vec<Recorded> = (0..5).map(|i| arrival(t0 + i * 1_000, "acme")).collect();
        recorded.extend((0..2).map(|i| arrival(t0 + 10_000 + i, "globex")));
        recorded.push(arrival(t0 + 1_500_000, "acme"));
        recorded.push(Recorded {
            path: "/elsewhere".into(),
            ..arrival(t0 + 1_600_000, "acme")
        });
        let spec = parse_rule_spec(
            "id: api\nmatch: { path: /api/* }\nkey: [header:x-tenant]\nshadow: true\n\
             tiers: [{ limit: 3, period: 1m }]\n",
        )
        .unwrap();
        let preview = replay(&spec, &recorded).unwrap();
        assert_eq!(
            (
                preview.requests,
                preview.matched,
                preview.admitted,
                preview.denied
            ),
            (9, 8, 5, 3)
        );
        assert_eq!(preview.denied_keys, [("acme".to_string(), 3)]);
        assert_eq!(
            preview.seconds,
            [(t0 / 1_000_000, 7, 5), (t0 / 1_000_000 + 1, 1, 0)]
        );
    }
}
