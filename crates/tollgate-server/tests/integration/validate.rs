//! `tollgate validate`: good files pass; every bad file is refused with its file, line and
//! column and what is wrong, in both formats, with the Envoy ratelimit service's own messages.

use crate::support;

use support::run;

fn validate(files: &[(&str, &str)]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["validate".to_string()];
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        args.push(path.to_string_lossy().into_owned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, out, err) = run(&args);
    (code, format!("{out}{err}"))
}

#[test]
fn the_shipped_examples_are_valid() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
    for name in [
        "multi-tenant.yaml",
        "envoy-ratelimit.yaml",
        "llm-proxy/rules.yaml",
    ] {
        let path = format!("{root}/{name}");
        let (code, out, err) = run(&["validate", &path]);
        assert_eq!(code, 0, "{name}: {out}{err}");
        assert!(out.starts_with("ok: "), "{out}");
    }
}

#[test]
fn redis_urls_of_every_scheme_validate() {
    for url in [
        "redis://127.0.0.1:6379/2",
        "redis://user:pw@redis.internal",
        "rediss://redis.internal:6380",
        "unix:///run/redis/redis.sock",
        "redis+unix:///run/redis/redis.sock?db=1",
    ] {
        let text = format!("store: {{ kind: redis, url: \"{url}\" }}\n");
        let (code, out) = validate(&[("store.yaml", &text)]);
        assert_eq!(code, 0, "{url}: {out}");
    }
}

#[test]
fn the_source_documents_spelling_loads() {
    let seed = "
slas:
  - id: get-product
    enabled: true
    match:
      methods: [ 'GET' ]
      pathPattern: /product/*
    tiers:
      - period: 10
        threshold: 1000
";
    let (code, out) = validate(&[("seed.yaml", seed)]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn native_errors_name_the_file_line_and_column() {
    let cases = [
        (
            "rules:\n  - id: a\n    tiers: [{ limit: 10, period: 10 parsecs }]\n",
            ":3:",
            "invalid duration",
        ),
        (
            "rules:\n  - id: a\n    tiers: [{ limit: 10, period: 1s }]\n    colour: red\n",
            ":4:",
            "unknown field `colour`",
        ),
        (
            "rules:\n  - id: a\n    tiers: [{ limit: 10, period: 1s }]\n  - id: b\n    algorithm: bogus\n    tiers: [{ limit: 1, period: 1s }]\n",
            ":5:16:",
            "unknown algorithm `bogus`",
        ),
        (
            "rules:\n  - id: a\n    tiers: [{ limit: 1, period: 1s }]\n  - id: a\n    tiers: [{ limit: 1, period: 1s }]\n",
            ":4:",
            "two rules have the id `a`",
        ),
        (
            "rules:\n  - id: a\n    match: { path: \"/x/{org}\" }\n    key: [segment:tenant]\n    tiers: [{ limit: 1, period: 1s }]\n",
            ":4:10:",
            "names no `{tenant}`",
        ),
        (
            "rules:\n  - id: a\n    tiers: [{ limit: 0, period: 1s }]\n",
            ":3:22:",
            "limit",
        ),
        (
            "rules: []\nstore:\n  kind: redis\n  url: http://127.0.0.1:6379\n",
            ":4:8:",
            "`http://127.0.0.1:6379` is not a Redis URL",
        ),
        (
            "store:\n  kind: redis\n  cluster: [\"redis://127.0.0.1:7000\", \"redis://:::7001\"]\n",
            ":3:40:",
            "`redis://:::7001` is not a Redis URL",
        ),
        (
            "rules:\n  - id: b\n    tiers: [{ limit: 1, period: 1s }]\n    algorithm: fixed_windw\n",
            ":4:16:",
            "did you mean `fixed_window`?",
        ),
        (
            "rules:\n  - id: a\n    tiers:\n      - { limit: 10, period: 1s }\n      - { limit: 5, period: 0s }\n",
            ":5:29:",
            "tiers[1].period",
        ),
        (
            "rules:\n  - id: a\n    enabled: yes please\n    tiers: [{ limit: 1, period: 1s }]\n",
            ":3:14:",
            "enabled: expected true or false, found `yes please`",
        ),
        (
            "rules:\n  - id: a\n    tiers:\n      - { limit: ten, period: 1s }\n",
            ":4:18:",
            "limit: expected a whole number, found `ten`",
        ),
        ("rules: [\n", ":", ""),
        // The store's settings, each at its own line, in plain words.
        (
            "store:\n  kind: redis\n  url: redis://127.0.0.1\n  max_unclaied: 4\n",
            ":4:3:",
            "unknown field `max_unclaied`: did you mean `max_unclaimed`?",
        ),
        (
            "store:\n  kind: redis\n  url: redis://127.0.0.1\n  max_keys: 10\n",
            ":4:13:",
            "`max_keys` is a setting of a memory store, and this store is `kind: redis`",
        ),
        (
            "store:\n  max_keys: 10\n",
            ":2:",
            "store: `kind` is needed: memory or redis",
        ),
        (
            "store:\n  kind: memory\n  max_keys: 1.5\n",
            ":3:13:",
            "max_keys: expected a whole number, found `1.5`",
        ),
        (
            "store:\n  kind: redis\n  url: redis://127.0.0.1\n  mode: hybird\n",
            ":4:9:",
            "mode: unknown value `hybird`: did you mean `hybrid`?",
        ),
        (
            "server:\n  drain: 5s\n  drain: 6s\n",
            ":3:3:",
            "`drain` is written twice in one mapping: keep one",
        ),
        (
            "server:\n  drain: |\n    10s later\n",
            ":3:",
            "drain: invalid duration `10s later",
        ),
        (
            "server:\n  drain: [1]\n",
            ":2:3:",
            "drain: expected a duration (`10s`, `1m`) or a whole number of seconds, found sequence",
        ),
        (
            "rules:\n  - id: a\n    algorithm:\n    tiers: [{ limit: 1, period: 1s }]\n",
            ":3:",
            "algorithm: a value is needed here",
        ),
        (
            "rules:\n  - id: a\n    tiers: [{ limit: 1, perod: 1s }]\n",
            ":3:",
            "unknown field `perod`: did you mean `period`?",
        ),
    ];
    for (text, place, says) in cases {
        let (code, out) = validate(&[("rules.yaml", text)]);
        assert_eq!(code, 1, "{text}");
        assert!(
            out.contains(&format!("rules.yaml{place}")),
            "{place} in {out}"
        );
        assert!(out.contains(says), "{says} in {out}");
    }
}

#[test]
fn envoy_errors_are_the_ones_that_service_gives() {
    let cases = [
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            "duplicate descriptor composite key 'd.k_v'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
            "invalid rate limit unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: \"\"\n",
            "descriptor has empty key",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, unlimited: true }\n",
            "should not specify rate limit unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    extra: 1\n",
            "config error, unknown key 'extra'",
        ),
    ];
    for (text, says) in cases {
        let (code, out) = validate(&[("envoy.yaml", text)]);
        assert_eq!(code, 1, "{text}");
        assert!(out.contains("envoy.yaml:"), "{out}");
        assert!(out.contains(says), "{says} in {out}");
    }
    let twice = "domain: d\ndescriptors: []\n";
    let (code, out) = validate(&[("a.yaml", twice), ("b.yaml", twice)]);
    assert_eq!(code, 1);
    assert!(out.contains("duplicate domain 'd' in config file"), "{out}");
}

#[test]
fn files_of_both_formats_merge() {
    let native = "rules:\n  - id: a\n    tiers: [{ limit: 1, period: 1s }]\n";
    let one = "domain: one\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n";
    let two = "domain: two\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n";
    let (code, out) = validate(&[("n.yaml", native), ("one.yaml", one), ("two.yaml", two)]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("3 rules (1 routes, 2 Envoy domains)"), "{out}");
}

/// What `serve` would refuse, or could not enforce, `validate` refuses, at the section or
/// rule at fault; and `serve` refuses the same files with the same message, before it binds
/// anything.
#[test]
fn validate_refuses_what_serve_refuses() {
    let rule = |algorithm: &str| {
        format!(
            "rules:\n  - id: api\n    algorithm: {algorithm}\n    tiers: [{{ limit: 3, period: 1d }}]\n"
        )
    };
    let cases = [
        (
            format!(
                "store: {{ kind: memory, max_keys: 0 }}\n{}",
                rule("fixed_window")
            ),
            "1:8: store: max_keys: must be at least 1",
        ),
        (
            format!(
                "store: {{ kind: memory, max_bytes: 0 }}\n{}",
                rule("fixed_window")
            ),
            "1:8: store: max_bytes: must be at least 4096 (4 KiB), not 0",
        ),
        (
            format!(
                "store: {{ kind: redis, url: \"redis://127.0.0.1:1\", timeout: 0s }}\n{}",
                rule("fixed_window")
            ),
            "1:8: store: timeout: must be longer than zero",
        ),
        (
            format!(
                "store: {{ kind: redis, url: \"redis://127.0.0.1:1\", mode: hybrid }}\n{}",
                rule("gcra")
            ),
            "3:5: rule `api`: algorithm: the hybrid store holds only fixed_window, sliding_window and hit_counter",
        ),
        (
            format!(
                "store: {{ kind: redis, url: \"redis://127.0.0.1:1\", mode: lease }}\n{}",
                rule("sliding_log")
            ),
            "3:5: rule `api`: algorithm: the lease store holds only fixed_window and hit_counter",
        ),
        (
            format!(
                "store: {{ kind: redis, url: \"redis://127.0.0.1:1\", mode: hybrid, sync_interval: 0s }}\n{}",
                rule("fixed_window")
            ),
            "1:8: store: sync_interval: must be at least 1 ms",
        ),
        (
            format!("server: {{ max_connections: 0 }}\n{}", rule("fixed_window")),
            "1:9: server.max_connections: must be at least 1",
        ),
        (
            format!("server: {{ idle_timeout: 0s }}\n{}", rule("fixed_window")),
            "1:9: server.idle_timeout: must be longer than zero",
        ),
    ];
    for (text, expected) in cases {
        let (code, out) = validate(&[("rules.yaml", &text)]);
        assert_eq!(code, 1, "{text}\n{out}");
        assert!(
            out.contains(&format!("rules.yaml:{expected}")),
            "{text}\n{out}"
        );
        // serve refuses it with the same words, and exits.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, &text).unwrap();
        let path = path.to_string_lossy().into_owned();
        let (code, out, err) = run(&[
            "serve",
            "--config",
            &path,
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
        ]);
        assert_ne!(code, 0, "serve took {text}");
        assert!(
            format!("{out}{err}").contains(&format!("rules.yaml:{expected}")),
            "{text}\n{out}{err}"
        );
    }
}

/// A byte that is not UTF-8 is placed at its line and column.
#[test]
fn bytes_that_are_not_text_are_placed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, b"rules:\n  - id: a\xff\n").unwrap();
    let (code, _, err) = run(&["validate", path.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("rules.yaml:2:10: not UTF-8 text"), "{err}");
}

#[test]
fn reservations_on_a_store_that_takes_none_are_refused_with_the_reason() {
    let rules = "rules:\n  - id: tokens\n    key: [header:x-tenant]\n    tiers: [{ limit: 1000, period: 1h }]\n    reservations: { ttl: 2m }\n";
    for mode in ["hybrid", "lease"] {
        let file = format!(
            "store: {{ kind: redis, url: \"redis://127.0.0.1:6379\", mode: {mode} }}\n{rules}"
        );
        let (code, out) = validate(&[("rules.yaml", &file)]);
        assert_eq!(code, 1, "{mode}: {out}");
        assert!(
            out.contains("rules.yaml:3:5: rule `tokens`: reservations:"),
            "{out}"
        );
        assert!(
            out.contains(&format!("the {mode} store takes no reservations")),
            "{out}"
        );
    }
    let strict = format!("store: {{ kind: redis, url: \"redis://127.0.0.1:6379\" }}\n{rules}");
    assert_eq!(validate(&[("rules.yaml", &strict)]).0, 0);
}

#[test]
fn calendar_periods_validate_and_bad_ones_are_placed() {
    let good = "rules:\n  - id: plan\n    key: [header:x-tenant]\n    time_zone: Europe/Paris\n    tiers:\n      - { limit: 10000, period: month }\n      - { limit: 1000, period: day, time_zone: America/New_York }\n      - { limit: 5000, period: week, week_starts: sunday }\n";
    let (code, out) = validate(&[("rules.yaml", good)]);
    assert_eq!(code, 0, "{out}");
    let rule =
        |tiers: &str, extra: &str| format!("rules:\n  - id: plan\n{extra}    tiers: [{tiers}]\n");
    let cases = [
        (
            rule("{ limit: 10, period: 1month }", ""),
            ":3:",
            "a calendar period takes no number: write `month`",
        ),
        (
            rule("{ limit: 10, period: month, time_zone: Europe/Pariss }", ""),
            ":3:",
            "tiers[0].time_zone: unknown time zone `Europe/Pariss`",
        ),
        (
            rule(
                "{ limit: 10, period: month }",
                "    time_zone: Mars/Olympus\n",
            ),
            ":3:",
            "tiers[0].time_zone: unknown time zone `Mars/Olympus`",
        ),
        (
            rule("{ limit: 10, period: 30d, time_zone: Europe/Paris }", ""),
            ":3:",
            "tiers[0].time_zone: `Europe/Paris` is for a calendar period",
        ),
        (
            rule("{ limit: 10, period: week, week_starts: caturday }", ""),
            ":3:",
            "`caturday` is not a day of the week",
        ),
        (
            rule("{ limit: 10, period: month, week_starts: sunday }", ""),
            ":3:",
            "week_starts: is for a calendar week, not a month",
        ),
        (
            rule("{ limit: 10, period: month }", "    algorithm: gcra\n"),
            ":4:",
            "tiers[0].period: a calendar period takes fixed_window or hit_counter",
        ),
        (
            format!(
                "store: {{ kind: redis, url: \"redis://127.0.0.1:6379\", mode: hybrid }}\n{}",
                rule("{ limit: 10, period: day }", "")
            ),
            ":3:",
            "the hybrid store counts windows of one length",
        ),
    ];
    for (text, at, message) in cases {
        let (code, out) = validate(&[("rules.yaml", &text)]);
        assert_eq!(code, 1, "{text}\n{out}");
        assert!(out.contains(&format!("rules.yaml{at}")), "{at} in {out}");
        assert!(out.contains(message), "{message} in {out}");
    }
}

#[test]
fn concurrency_rules_validate_and_bad_ones_are_placed() {
    let rule = |tiers: &str| {
        format!("rules:\n  - id: exports\n    algorithm: concurrency\n    tiers: [{tiers}]\n")
    };
    let (code, out) = validate(&[("rules.yaml", &rule("{ limit: 5, period: 30s }"))]);
    assert_eq!(code, 0, "{out}");
    let strict = format!(
        "store: {{ kind: redis, url: \"redis://127.0.0.1:6379\" }}\n{}",
        rule("{ limit: 5, period: 30s }")
    );
    assert_eq!(validate(&[("rules.yaml", &strict)]).0, 0);
    let cases = [
        (
            rule("{ limit: 1001, period: 30s }"),
            ":4:",
            "tiers[0].limit: a concurrency tier keeps each slot's lease, so at most 1000 slots",
        ),
        (
            rule("{ limit: 5, period: day }"),
            ":4:",
            "a calendar period takes fixed_window or hit_counter, not concurrency",
        ),
        (
            format!(
                "store: {{ kind: redis, url: \"redis://127.0.0.1:6379\", mode: lease }}\n{}",
                rule("{ limit: 5, period: 30s }")
            ),
            ":3:",
            "the lease store holds only fixed_window and hit_counter",
        ),
        (
            format!(
                "store: {{ kind: redis, url: \"redis://127.0.0.1:6379\", mode: hybrid }}\n{}",
                rule("{ limit: 5, period: 30s }")
            ),
            ":3:",
            "concurrency is held by the strict Redis store and the memory store",
        ),
    ];
    for (text, at, message) in cases {
        let (code, out) = validate(&[("rules.yaml", &text)]);
        assert_eq!(code, 1, "{text}\n{out}");
        assert!(out.contains(&format!("rules.yaml{at}")), "{at} in {out}");
        assert!(out.contains(message), "{message} in {out}");
    }
}

#[test]
fn bans_validate_and_bad_ones_are_placed() {
    let rule = |algorithm: &str, ban: &str| {
        format!(
            "rules:\n  - id: api\n    algorithm: {algorithm}\n    tiers: [{{ limit: 5, period: 1s }}]\n    ban: {ban}\n"
        )
    };
    assert_eq!(validate(&[("rules.yaml", &rule("gcra", "10m"))]).0, 0);
    for (algorithm, ban, message) in [
        (
            "leaky_bucket(shaper)",
            "10m",
            "ban: leaky_bucket(shaper) makes a denied check wait its turn",
        ),
        (
            "concurrency",
            "10m",
            "ban: concurrency makes a denied check wait its turn",
        ),
        ("fixed_window", "0s", "ban: a ban must be longer than zero"),
        ("fixed_window", "soon", "ban:"),
    ] {
        let (code, out) = validate(&[("rules.yaml", &rule(algorithm, ban))]);
        assert_eq!(code, 1, "{algorithm} {ban}: {out}");
        assert!(out.contains("rules.yaml:5:"), "at the field: {out}");
        assert!(out.contains(message), "{message} in {out}");
    }
}

#[test]
fn client_prefixes_and_trusted_ranges_are_checked_at_their_place() {
    for key in [
        "[\"client_ip(v4=24, v6=48)\"]",
        "[client_ip(v4=24 v6=48)]",
        "\n      - client_ip(v4=24, v6=48)",
    ] {
        let good = format!(
            "server: {{ trusted_proxies: [\"10.0.0.0/8\", \"::1\"] }}\nrules:\n  - id: a\n    key: {key}\n    tiers: [{{ limit: 1, period: 1s }}]\n"
        );
        let (code, out) = validate(&[("rules.yaml", &good)]);
        assert_eq!(code, 0, "{key}: {out}");
    }
    // Unquoted in a flow list, YAML cuts the part at its comma: said so.
    let cut = "rules:\n  - id: a\n    key: [client_ip(v4=24, v6=48)]\n    tiers: [{ limit: 1, period: 1s }]\n";
    let (code, out) = validate(&[("rules.yaml", cut)]);
    assert_eq!(code, 1);
    assert!(out.contains("quote a part that holds one"), "{out}");
    for (text, at, message) in [
        (
            "server: { trusted_proxies: [\"10.0.0.0/33\"] }\n",
            ":1:",
            "server.trusted_proxies: `10.0.0.0/33`: /33 is longer than the address",
        ),
        (
            "rules:\n  - id: a\n    key: [client_ip(v6=129)]\n    tiers: [{ limit: 1, period: 1s }]\n",
            ":3:",
            "v6=129: must be 1 to 128",
        ),
        (
            "rules:\n  - id: a\n    key: [client_ip(v5=8)]\n    tiers: [{ limit: 1, period: 1s }]\n",
            ":3:",
            "expected client_ip(v4=BITS, v6=BITS)",
        ),
    ] {
        let (code, out) = validate(&[("rules.yaml", text)]);
        assert_eq!(code, 1, "{text}\n{out}");
        assert!(out.contains(&format!("rules.yaml{at}")), "{at} in {out}");
        assert!(out.contains(message), "{message} in {out}");
    }
}
