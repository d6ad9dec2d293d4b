//! Three regions, each its own redis-server and two `tollgate serve` instances, linked through
//! proxies the test controls: a global rule holds its bound for 30 tenants bursting in every
//! region at once; answers name the region; a region cut off says so (`/readyz`, metrics,
//! decisions) and converges when healed; `tollgate check` names the region.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use support::proxy::Proxy;
use support::{Redis, Server};

const NAMES: [&str; 3] = ["us-east", "eu-west", "ap-south"];
const LIMIT: u64 = 60;
const OVERSHOOT: f64 = 0.1;
const TENANTS: usize = 30;

/// The documented bound: `limit + (regions - 1) x max(1, overshoot x limit / peers)`.
fn bound() -> u64 {
    let allowance = ((OVERSHOOT * LIMIT as f64 / 2.0).floor() as u64).max(1);
    LIMIT + 2 * allowance
}

/// `stale_after` is how long a silent peer is waited for: short where a cut is tested, long
/// where only the bound is, so a machine loaded by other work does not read as a partition.
fn config(region: usize, redis: &Redis, links: &[Option<Proxy>], stale_after: &str) -> String {
    let peers: Vec<String> = links
        .iter()
        .enumerate()
        .filter_map(|(s, link)| {
            link.as_ref()
                .map(|l| format!("      - {{ name: {}, url: \"{}\" }}", NAMES[s], l.url()))
        })
        .collect();
    format!(
        "store:
  kind: redis
  url: \"{url}\"
  timeout: 1s
  regions:
    region: {region}
    interval: 20ms
    overshoot: {OVERSHOOT}
    peers:
{peers}
rules:
  - id: plan
    key: [header:x-tenant]
    algorithm: fixed_window
    scope: global
    stale_after: {stale_after}
    on_failure: closed
    tiers: [{{ limit: {LIMIT}, period: 1h }}]
",
        url = redis.url(),
        region = NAMES[region],
        peers = peers.join("\n"),
    )
}

struct World {
    redis: Vec<Redis>,
    links: Vec<Vec<Option<Proxy>>>,
    servers: Vec<Vec<Server>>,
}

async fn world(stale_after: &str) -> World {
    let redis: Vec<Redis> = (0..3).map(|_| Redis::start()).collect();
    let mut links = Vec::new();
    for r in 0..3 {
        let mut row = Vec::new();
        for (s, server) in redis.iter().enumerate() {
            row.push(match r == s {
                true => None,
                false => Some(Proxy::start(&format!("127.0.0.1:{}", server.port)).await),
            });
        }
        links.push(row);
    }
    let servers = (0..3)
        .map(|r| {
            let text = config(r, &redis[r], &links[r], stale_after);
            (0..2)
                .map(|_| Server::start(&[("rules.yaml", &text)], &["--admin-token", "secret"]))
                .collect()
        })
        .collect();
    World {
        redis,
        links,
        servers,
    }
}

impl World {
    fn isolate(&self, r: usize, cut: bool) {
        for (a, row) in self.links.iter().enumerate() {
            for (b, link) in row.iter().enumerate() {
                if let Some(link) = link
                    && (a == r || b == r)
                {
                    if cut { link.cut() } else { link.heal() }
                }
            }
        }
    }
}

async fn ask(client: &reqwest::Client, server: &str, tenant: usize) -> serde_json::Value {
    let body = serde_json::json!({"rule": "plan", "key": format!("tenant-{tenant}"), "cost": 1});
    let (_, _, json) = support::check(client, server, body).await;
    json
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_tenants_bursting_in_three_regions_share_one_limit() {
    // The plan's hour must not turn while the regions count it.
    support::clear_of_a_windows_turn(Duration::from_secs(3600), Duration::from_secs(90)).await;
    let world = world("5s").await;
    let client = reqwest::Client::new();
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..TENANTS).map(|_| AtomicU64::new(0)).collect());
    // The console records from its first use: it is opened before the burst.
    let console = |path: &str| {
        client
            .get(format!("{}{path}", world.servers[0][0].http))
            .bearer_auth("secret")
            .send()
    };
    assert_eq!(console("/v1/console/overview").await.unwrap().status(), 200);
    let end = Instant::now() + Duration::from_secs(30);
    let mut tasks = Vec::new();
    for (r, servers) in world.servers.iter().enumerate() {
        for server in servers {
            for tenant in 0..TENANTS {
                let (client, admitted) = (client.clone(), admitted.clone());
                let http = server.http.clone();
                tasks.push(tokio::spawn(async move {
                    while Instant::now() < end {
                        let json = ask(&client, &http, tenant).await;
                        assert_eq!(json["region"], NAMES[r], "{json}");
                        let decision = &json["decisions"][0];
                        assert_eq!(decision["source"], "global", "{json}");
                        if json["allowed"] == true {
                            admitted[tenant].fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        // The window is spent: a retry after more than a second.
                        let retry = decision["retry_after_ms"].as_u64().unwrap();
                        if retry > 1_000 {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(retry.min(50))).await;
                    }
                }));
            }
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    for (tenant, count) in admitted.iter().enumerate() {
        let count = count.load(Ordering::Relaxed);
        assert!(count <= bound(), "tenant {tenant}: {count} > {}", bound());
        assert!(count >= LIMIT, "tenant {tenant}: only {count}");
    }
    // Every region's view of a tenant, through the admin API, adds up to what it admitted.
    let url = format!(
        "{}/v1/regions?rule=plan&key=tenant-0",
        world.servers[1][0].http
    );
    let regions = || async {
        client
            .get(&url)
            .bearer_auth("secret")
            .send()
            .await
            .unwrap()
            .json::<serde_json::Value>()
            .await
            .unwrap()
    };
    let used = |answer: &serde_json::Value| -> u64 {
        answer["usage"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["admitted"].as_u64().unwrap())
            .sum()
    };
    let total = admitted[0].load(Ordering::Relaxed);
    support::eventually("eu-west holds every region's count of tenant-0", || async {
        used(&regions().await) == total
    })
    .await;
    let answer = regions().await;
    assert_eq!(answer["region"], "eu-west");
    assert!(
        answer["peers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["up"] == true),
        "{answer}"
    );
    // The console shows a hot key's use per region.
    let page: serde_json::Value = console("/v1/console/rules/plan")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let hot = &page["hot"]["hits"][0];
    let regions = hot["regions"]
        .as_array()
        .expect("a global rule's key has its regions");
    assert_eq!(regions.len(), 3, "{hot}");
    let shown: u64 = regions
        .iter()
        .map(|r| r["admitted"].as_u64().unwrap())
        .sum();
    assert!((LIMIT..=bound()).contains(&shown), "{hot}");
    let metrics = support::metrics(&world.servers[0][0].http).await;
    assert!(
        metrics.contains("tollgate_region_peer_up{region=\"us-east\",peer=\"eu-west\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("tollgate_region_admitted_total{region=\"us-east\",rule=\"plan\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_region_cut_off_says_so_everywhere_and_converges_when_healed() {
    // The plan's hour must not turn while the regions count it.
    support::clear_of_a_windows_turn(Duration::from_secs(3600), Duration::from_secs(90)).await;
    let world = world("300ms").await;
    let client = reqwest::Client::new();
    let cut_off = &world.servers[2][0].http;
    // The links hold: a first check everywhere.
    for servers in &world.servers {
        assert_eq!(ask(&client, &servers[0].http, 0).await["allowed"], true);
    }
    world.isolate(2, true);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut admitted = 3;
    let mut partitioned = 0;
    for _ in 0..100 {
        for servers in &world.servers {
            let json = ask(&client, &servers[0].http, 0).await;
            admitted += u64::from(json["allowed"] == true);
            partitioned += u64::from(json["decisions"][0]["source"] == "partitioned");
        }
    }
    assert!(admitted <= bound(), "{admitted}");
    assert_eq!(partitioned, 300, "every region decided on its share");
    let ready = client
        .get(format!("{cut_off}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let text = ready.text().await.unwrap();
    assert!(
        text.starts_with("ready, partitioned:") && text.contains("us-east"),
        "{text}"
    );
    let metrics = support::metrics(cut_off).await;
    assert!(
        metrics.contains("tollgate_region_peer_up{region=\"ap-south\",peer=\"us-east\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_policy_decisions_total{rule=\"plan\",source=\"partitioned\"}")
    );
    world.servers[2][0].wait_for_log("peer region does not answer", Duration::from_secs(5));
    // Healed: the counts converge, and the regions count on each other again.
    world.isolate(2, false);
    let fields = || -> Vec<String> {
        world
            .redis
            .iter()
            .map(|r| {
                let key = r.cli(&["--scan", "--pattern", "tg:g:plan:*"]);
                let mut fields: Vec<String> = r
                    .cli(&["hgetall", key.trim()])
                    .lines()
                    .collect::<Vec<_>>()
                    .chunks(2)
                    .filter(|p| !p[0].starts_with('a'))
                    .map(|p| p.join("="))
                    .collect();
                fields.sort();
                fields.join(",")
            })
            .collect()
    };
    support::eventually("every region holds the same counts", || async {
        let fields = fields();
        fields[0] == fields[1] && fields[0] == fields[2]
    })
    .await;
    support::eventually("the cut-off region hears its peers again", || async {
        let ready = client
            .get(format!("{cut_off}/readyz"))
            .send()
            .await
            .unwrap();
        ready.text().await.unwrap() == "ready\n"
    })
    .await;
    // Once ready, it decides on the regions' counts again (a round late on a loaded machine
    // can make one more decision partitioned).
    support::eventually("the healed region decides on global counts", || async {
        ask(&client, cut_off, 0).await["decisions"][0]["source"] == "global"
    })
    .await;
    // `tollgate check` names the region that answered.
    let (code, _, stderr) = support::run(&[
        "check",
        "--server",
        &world.servers[1][1].http,
        "--rule",
        "plan",
        "--key",
        "tenant-9",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("(region eu-west)"), "{stderr}");
}

#[test]
fn bad_regions_and_global_rules_are_refused_at_their_place() {
    let dir = tempfile::tempdir().unwrap();
    let store = "store:\n  kind: redis\n  url: redis://127.0.0.1:1\n";
    let rule = "rules:\n  - id: plan\n    tiers: [{ limit: 10, period: 1m }]\n";
    for (text, said) in [
        (
            format!("{rule}    scope: global\n"),
            "2:5: rule `plan`: scope: a global rule is one limit across regions: it needs a Redis store with `regions`",
        ),
        (
            format!("{rule}    stale_after: 1s\n"),
            "rule `plan`: stale_after: a setting of a global rule; add `scope: global`",
        ),
        (
            format!("{rule}    scope: global\n    algorithm: token_bucket\n"),
            "token_bucket cannot be global: a bucket's level drains with time",
        ),
        (
            format!("{store}  regions:\n    region: us east\n"),
            "store: regions: region \"us east\": must be 1 to 64 letters, digits, - or _",
        ),
        (
            format!("{store}  regions:\n    region: us-east\n    peers: [{{ name: eu-west }}]\n"),
            "6:21: store.regions: peer `eu-west` needs either `url` or `cluster`",
        ),
        (
            format!("{store}  regions:\n    region: us-east\n    overshoot: 2\n"),
            "overshoot 2: must be above 0 and at most 1",
        ),
        (
            "store:\n  kind: memory\n  regions: { region: us-east }\n".to_string(),
            "`regions` is a setting of a redis store",
        ),
    ] {
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, &text).unwrap();
        let (code, _, stderr) = support::run(&["validate", path.to_str().unwrap()]);
        assert_eq!(code, 1, "{text}");
        assert!(stderr.contains(said), "{text}\n{stderr}");
    }
}
