//! A corpus of mutated rule files, made from the shipped examples and richer files of both
//! formats by deleting, inserting, duplicating and re-indenting what is in them: every file
//! that `validate` refuses is refused at a line and column, in a reader's words.

use std::path::PathBuf;

use tollgate_server::service;
use tollgate_server::{config, provider};

const NATIVE: &str = include_str!("../../../../examples/multi-tenant.yaml");
const ENVOY: &str = include_str!("../../../../examples/envoy-ratelimit.yaml");

/// Every native field, in block and flow style.
const NATIVE_FULL: &str = "\
server:
  http: 127.0.0.1:8080
  grpc: 127.0.0.1:8081
  max_body_bytes: 65536
  drain: 5s
  max_connections: 1000
  header_timeout: 10s
  idle_timeout: 60s
  grpc_response_headers: true
store:
  kind: redis
  url: redis://127.0.0.1:6379/0
  mode: hybrid
  timeout: 20ms
  instances: 3
  sync_interval: 1s
  max_unclaimed: 4
rules:
  - id: login
    enabled: true
    shadow: false
    on_failure: local:0.25
    match:
      methods: [POST]
      path: /v1/{tenant}/login
      headers: { x-tenant: '*' }
    key: [segment:tenant, header:x-tenant, client_ip]
    algorithm: sliding_window
    tiers:
      - { limit: 10, period: 1s }
      - limit: 50
        period: 1m
  - id: search
    match: { path: /v1/search/* }
    key: [route, method, 'text:all']
    algorithm: fixed_window
    on_failure: closed
    tiers: [ { limit: 100, period: 10s } ]
";

/// Envoy's fields: nesting, wildcards, replaces, metadata, quota mode.
const ENVOY_FULL: &str = "\
domain: shop
descriptors:
  - key: tenant
    descriptors:
      - key: path
        value: /api*v1
        share_threshold: true
        detailed_metric: true
        rate_limit:
          name: api
          unit: minute
          requests_per_unit: 100
      - key: path
        value: /login
        rate_limit:
          unit: second
          requests_per_unit: 5
          replaces:
            - name: api
  - key: plan
    value: free
    quota_mode: true
    value_to_metric: true
    metadata:
      owner: team-a
      tags: [a, b]
    rate_limit:
      unit: hour
      requests_per_unit: 1000
  - key: internal
    rate_limit:
      unlimited: true
  - key: shadowed
    shadow_mode: true
    rate_limit: { unit: day, requests_per_unit: 0 }
";

/// A small deterministic generator (xorshift64*), so a failure names a reproducible case.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const JUNK: &[&str] = &[
    ":",
    "-",
    " ",
    "[",
    "]",
    "{",
    "}",
    "'",
    "\"",
    "#",
    "\t",
    "\n",
    "*",
    "&a",
    "*a",
    "!",
    "|",
    ">",
    "%",
    "@",
    "`",
    ",",
    "?",
    "0",
    "-1",
    "1e99",
    "99999999999999999999",
    "~",
    "null",
    "yes please",
    "true",
    "x",
    "\u{0}",
    "é",
    "{}",
    "[]",
    "1s",
    "0s",
    "-5m",
    "fixed_windw",
    "unit",
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "tiers",
    "limit",
    "period",
];

fn mutate(text: &str, rng: &mut Rng) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    for _ in 0..1 + rng.below(3) {
        let lines: Vec<Vec<u8>> = bytes.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
        let at = rng.below(bytes.len());
        let line = rng.below(lines.len());
        bytes = match rng.below(10) {
            0 => {
                bytes.remove(at.min(bytes.len().saturating_sub(1)));
                bytes
            }
            1 => {
                let junk = rng.pick(JUNK).as_bytes();
                bytes.splice(at..at, junk.iter().copied());
                bytes
            }
            2 => {
                let mut lines = lines;
                let copy = lines[line].clone();
                lines.insert(line, copy);
                lines.join(&b'\n')
            }
            3 => {
                let mut lines = lines;
                lines.remove(line);
                lines.join(&b'\n')
            }
            4 => {
                let mut lines = lines;
                if rng.below(2) == 0 {
                    lines[line].splice(0..0, *b"  ");
                } else if lines[line].starts_with(b"  ") {
                    lines[line].drain(..2);
                }
                lines.join(&b'\n')
            }
            5 => {
                // A value replaced with junk.
                let mut lines = lines;
                if let Some(colon) = lines[line].iter().position(|&b| b == b':') {
                    lines[line].truncate(colon + 1);
                    lines[line].push(b' ');
                    lines[line].extend_from_slice(rng.pick(JUNK).as_bytes());
                }
                lines.join(&b'\n')
            }
            6 => {
                let byte = *rng.pick(&[0xff_u8, 0xc3, 0x80, 0xfe]);
                bytes.insert(at, byte);
                bytes
            }
            7 => {
                bytes.truncate(at);
                bytes
            }
            8 => {
                let mut lines = lines;
                let other = rng.below(lines.len());
                lines.swap(line, other);
                lines.join(&b'\n')
            }
            _ => {
                // A key renamed to another key of the file.
                let mut lines = lines;
                let donor = lines[rng.below(lines.len())].clone();
                let key = |l: &[u8]| l.iter().position(|&b| b == b':');
                if let (Some(a), Some(b)) = (key(&lines[line]), key(&donor)) {
                    let indent = lines[line]
                        .iter()
                        .take_while(|&&c| c == b' ' || c == b'-')
                        .count();
                    let donor_indent = donor
                        .iter()
                        .take_while(|&&c| c == b' ' || c == b'-')
                        .count();
                    if indent <= a && donor_indent <= b {
                        let name = donor[donor_indent..b].to_vec();
                        lines[line].splice(indent..a, name);
                    }
                }
                lines.join(&b'\n')
            }
        };
        if bytes.is_empty() {
            break;
        }
    }
    bytes
}

/// What a message must not say: the YAML and serde libraries' words for Rust types and
/// options, which mean nothing to someone writing a rule file.
const JARGON: &[&str] = &[
    "Option<",
    "DuplicateKeyPolicy",
    "untagged enum",
    "internally tagged",
    "usize",
    "u64",
    "u32",
    "struct ",
    "invalid type",
];

/// Loads `bytes` as `validate` checks a file: read, parsed, merged, and checked as `serve`
/// would. `Ok` when accepted.
fn validate(name: &str, bytes: &[u8]) -> Result<(), config::ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    let loaded = provider::load(&[path])?;
    service::check(&loaded)
}

#[test]
fn every_refused_mutant_is_refused_at_a_line_and_column() {
    let seeds = [
        ("native.yaml", NATIVE),
        ("envoy.yaml", ENVOY),
        ("native-full.yaml", NATIVE_FULL),
        ("envoy-full.yaml", ENVOY_FULL),
    ];
    for (name, seed) in seeds {
        validate(name, seed.as_bytes()).unwrap_or_else(|e| panic!("the seed {name}: {e}"));
    }
    // TOLLGATE_MUTANTS=N and TOLLGATE_MUTANT_SEED=S search further than the suite does.
    let setting = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let cases = setting("TOLLGATE_MUTANTS", 2000) as usize;
    let mut rng = Rng(setting("TOLLGATE_MUTANT_SEED", 0x7011_6a7e));
    let (mut refused, mut placeless) = (0, Vec::new());
    for case in 0..cases {
        let (name, seed) = seeds[case % seeds.len()];
        let mutant = mutate(seed, &mut rng);
        if let Err(error) = validate(name, &mutant) {
            refused += 1;
            let jargon = JARGON.iter().find(|j| error.message.contains(*j));
            if error.at.is_none() || jargon.is_some() {
                placeless.push(format!(
                    "case {case} ({name}): {error}\n---\n{}\n---",
                    String::from_utf8_lossy(&mutant)
                ));
            }
        }
    }
    assert!(
        refused > cases / 2,
        "the mutations should break most files: {refused} of {cases}"
    );
    assert!(
        placeless.is_empty(),
        "{} of {refused} refused files name no line, or speak Rust:\n{}",
        placeless.len(),
        placeless.join("\n")
    );
}
