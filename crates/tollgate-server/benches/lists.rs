//! A check through the service with the allow and deny lists in place, beside a plain check
//! in the same run: the lists hold 10,000 deny entries of other keys (a check looks its key up
//! and goes on to the rule), and an allowed key (answered from the list). Memory store,
//! 10,000 keys in turn, each check awaited on a one-thread runtime.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tollgate_server::config::{ListEntry, ListKind};
use tollgate_server::provider;
use tollgate_server::service::Service;

const RULES: &str = "rules:\n  - id: api\n    key: [header:x-tenant]\n    tiers: [{ limit: 1000000000, period: 1h }]\n";

fn service(runtime: &tokio::runtime::Runtime, dir: &std::path::Path) -> Arc<Service> {
    let file = dir.join("rules.yaml");
    std::fs::write(&file, RULES).unwrap();
    let files = vec![file];
    let config = provider::load(&files).unwrap();
    Arc::new(runtime.block_on(Service::start(files, config)).unwrap())
}

fn lists(c: &mut Criterion) {
    let mut group = c.benchmark_group("lists");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plain = service(&runtime, dir.path());
    let listed = service(&runtime, dir.path());
    for i in 0..10_000 {
        let entry = ListEntry {
            list: ListKind::Deny,
            rule: if i % 2 == 0 { "api".into() } else { "*".into() },
            key: format!("banned-{i}"),
            expires_at_ms: None,
            status: None,
            reason: None,
        };
        runtime
            .block_on(listed.set_list_entry(entry, true))
            .unwrap();
    }
    let allowed = ListEntry {
        list: ListKind::Allow,
        rule: "api".into(),
        key: "vip".into(),
        expires_at_ms: None,
        status: None,
        reason: None,
    };
    runtime
        .block_on(listed.set_list_entry(allowed, true))
        .unwrap();
    let keys: Vec<String> = (0..10_000).map(|i| format!("tenant-{i:05}")).collect();
    let next = std::cell::Cell::new(0usize);
    let key = || {
        let i = next.get();
        next.set((i + 1) % keys.len());
        keys[i].as_bytes()
    };
    group.bench_function(BenchmarkId::new("service", "check"), |b| {
        b.to_async(&runtime).iter(|| async {
            plain
                .check_key("api", black_box(key()), 1, None)
                .await
                .unwrap()
        })
    });
    group.bench_function(BenchmarkId::new("service", "check_lists_10k"), |b| {
        b.to_async(&runtime).iter(|| async {
            listed
                .check_key("api", black_box(key()), 1, None)
                .await
                .unwrap()
        })
    });
    group.bench_function(BenchmarkId::new("service", "allowed_key"), |b| {
        b.to_async(&runtime).iter(|| async {
            listed
                .check_key("api", black_box(b"vip"), 1, None)
                .await
                .unwrap()
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
        .without_plots();
    targets = lists
}
criterion_main!(benches);
