//! tollgate's Redis module (`crates/tollgate-redis-module`) where users run it: beside a
//! replica and an AOF that have no module (effects are replicated, not the command), shared
//! with instances that call the functions (a rollout), on a server that loses it, under ACL
//! key patterns, and at the server's clock. The decisions themselves are held to the memory
//! store's in `redis_differential.rs`, and on a Cluster in `redis_cluster.rs`.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use support::RedisServer;
use tollgate::{
    Algorithm, Limiter, RedisStore, Rule, Source, StoreTime, SubWindows, Tier, TokenBucket, WarmUp,
};

fn module_server(extra: &[&str]) -> RedisServer {
    let mut args = vec!["--loadmodule", support::redis_module()];
    args.extend_from_slice(extra);
    RedisServer::start_with(&args)
}

async fn store(server: &RedisServer, module: bool) -> RedisStore {
    RedisStore::builder(&server.url())
        .timeout(Duration::from_secs(5))
        .module(module)
        .build()
        .await
        .unwrap()
}

/// A limiter of `rule` whose keys are named under `prefix`, with or without the module.
async fn prefixed(
    server: &RedisServer,
    prefix: &str,
    module: bool,
    rule: &Rule,
) -> Limiter<RedisStore> {
    let store = RedisStore::builder(&server.url())
        .timeout(Duration::from_secs(5))
        .key_prefix(prefix)
        .module(module)
        .build()
        .await
        .unwrap();
    Limiter::builder(rule.clone()).store(store).build().unwrap()
}

async fn connection(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// One rule of each kind of state the module keeps: counts, a bucket level, a time, a
/// double (warm-up), sub-windows and slots. Their keys outlive any test by minutes, so that
/// none expires between two reads of one server: every period is an hour or more (a warm-up
/// key lives the stable interval times the permits it took), and the fixed window, which
/// ends on a multiple of its period, is 30 days long, not an hour that may end mid-test.
fn rules() -> Vec<Rule> {
    let day = Duration::from_secs(86_400);
    [
        ("fixed", Algorithm::FixedWindow, Tier::new(50, 30 * day)),
        (
            "bucket",
            Algorithm::TokenBucket(TokenBucket::default()),
            Tier::per_hour(50),
        ),
        ("gcra", Algorithm::Gcra, Tier::per_hour(50).with_burst(20)),
        (
            "warm",
            Algorithm::WarmUp(WarmUp::new(Duration::from_secs(600))),
            Tier::per_hour(50),
        ),
        (
            "windows",
            Algorithm::SubWindows(SubWindows { count: 4 }),
            Tier::new(50, day),
        ),
        ("slots", Algorithm::Concurrency, Tier::per_hour(30)),
    ]
    .into_iter()
    .map(|(name, algorithm, tier)| Rule::new(name, algorithm, [tier]).unwrap())
    .collect()
}

/// Every key of `server`, with its `DUMP` (type and value) and its `PEXPIRETIME`.
async fn contents(redis: &mut MultiplexedConnection) -> Vec<(Vec<u8>, Vec<u8>, i64)> {
    let mut keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*")
        .query_async(redis)
        .await
        .unwrap();
    keys.sort();
    let mut contents = Vec::new();
    for key in keys {
        let (dump, expiry): (Vec<u8>, i64) = redis::pipe()
            .cmd("DUMP")
            .arg(&key)
            .cmd("PEXPIRETIME")
            .arg(&key)
            .query_async(redis)
            .await
            .unwrap();
        contents.push((key, dump, expiry));
    }
    contents
}

/// Checks every rule of [`rules`] on `store`, `count` times over three keys; each decided by
/// the module. Returns how many were admitted.
async fn check_every_rule(store: &RedisStore, count: u64, source: Source) -> u64 {
    let mut admitted = 0;
    for rule in rules() {
        let limiter = Limiter::builder(rule).store(store.clone()).build().unwrap();
        for i in 0..count {
            let d = limiter
                .check(&format!("key-{}", i % 3), 1 + i % 2)
                .await
                .unwrap();
            assert_eq!(d.source(), source, "{}", limiter.rule().name());
            admitted += u64::from(d.allowed());
        }
    }
    admitted
}

/// A replica without the module, after `WAIT`, holds exactly the primary's keys, values and
/// expiry times: the module replicates the `SET ... PXAT` it decided on, never its command,
/// on the server's time and on the caller's (where the expiry it sets is relative).
#[tokio::test]
async fn a_replica_without_the_module_holds_what_the_primary_decided() {
    let primary = module_server(&[]);
    let port = primary.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !replica
        .cli(&["info", "replication"])
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < deadline, "the replica did not sync");
        std::thread::sleep(Duration::from_millis(20));
    }
    let store = store(&primary, true).await;
    let admitted = check_every_rule(&store, 120, Source::RedisModule).await;
    assert!(admitted > 0);
    let local = RedisStore::builder(&primary.url())
        .timeout(Duration::from_secs(5))
        .key_prefix("local:")
        .store_time(StoreTime::Local)
        .build()
        .await
        .unwrap();
    assert!(check_every_rule(&local, 120, Source::RedisModule).await > 0);
    assert_eq!(primary.cli(&["wait", "1", "5000"]), "1");
    let on_primary = contents(&mut connection(&primary).await).await;
    let on_replica = contents(&mut connection(&replica).await).await;
    assert_eq!(on_primary.len(), rules().len() * 3 * 2, "{on_primary:?}");
    assert_eq!(on_primary, on_replica);
    let stats = replica.cli(&["info", "commandstats"]);
    assert!(!stats.contains("tollgate"), "{stats}");
}

/// A server that wrote its AOF with the module, restarted without it, has every key as it
/// was; the functions take over from there and the limit holds exactly.
#[tokio::test]
async fn an_aof_written_with_the_module_is_read_back_without_it() {
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut server = module_server(&aof);
    let module = store(&server, true).await;
    check_every_rule(&module, 60, Source::RedisModule).await;
    let fixed = Rule::new("tenants", Algorithm::FixedWindow, [Tier::per_hour(10)]).unwrap();
    let limiter = Limiter::builder(fixed.clone())
        .store(module)
        .build()
        .unwrap();
    for _ in 0..6 {
        assert!(limiter.check("tenant", 1).await.unwrap().allowed());
    }
    let before = contents(&mut connection(&server).await).await;
    server.restart_with(&aof);
    assert!(!server.cli(&["module", "list"]).contains("tollgate"));
    let after = contents(&mut connection(&server).await).await;
    assert_eq!(before, after);
    let functions = store(&server, true).await;
    let limiter = Limiter::builder(fixed).store(functions).build().unwrap();
    for _ in 0..4 {
        let d = limiter.check("tenant", 1).await.unwrap();
        assert!(d.allowed());
        assert_eq!(d.source(), Source::Redis, "no module: the functions decide");
    }
    assert!(!limiter.check("tenant", 1).await.unwrap().allowed());
}

/// A rollout: instances with the module and instances without share one server and its keys,
/// 64 callers between them, and every limit admits exactly its limit, for every kind of state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_with_and_without_the_module_share_keys_exactly() {
    let server = module_server(&[]);
    let stores = [store(&server, true).await, store(&server, false).await];
    let day = Duration::from_secs(86_400);
    let cases = [
        (Algorithm::FixedWindow, Tier::new(300, day)),
        (Algorithm::SlidingWindow, Tier::new(300, day)),
        (
            Algorithm::TokenBucket(TokenBucket::default()),
            Tier::new(300, day),
        ),
        (Algorithm::Gcra, Tier::new(300, day).with_burst(300)),
        (Algorithm::IntervalBucket, Tier::new(300, day)),
        (Algorithm::Concurrency, Tier::new(300, day)),
    ];
    for (i, (algorithm, tier)) in cases.into_iter().enumerate() {
        let rule = Rule::new(format!("rollout-{i}"), algorithm, [tier]).unwrap();
        let limiters: Vec<Arc<Limiter<RedisStore>>> = stores
            .iter()
            .map(|store| {
                let limiter = Limiter::builder(rule.clone()).store(store.clone());
                Arc::new(limiter.build().unwrap())
            })
            .collect();
        let (admitted, by_module) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut callers = Vec::new();
        for caller in 0..64 {
            let limiter = limiters[caller % 2].clone();
            let (admitted, by_module) = (admitted.clone(), by_module.clone());
            callers.push(tokio::spawn(async move {
                for _ in 0..16 {
                    let d = limiter.check("shared", 1).await.unwrap();
                    assert!(matches!(d.source(), Source::Redis | Source::RedisModule));
                    admitted.fetch_add(u64::from(d.allowed()), Ordering::Relaxed);
                    by_module.fetch_add(
                        u64::from(d.source() == Source::RedisModule),
                        Ordering::Relaxed,
                    );
                }
            }));
        }
        for caller in callers {
            caller.await.unwrap();
        }
        let name = rule.algorithm().name();
        assert_eq!(
            admitted.load(Ordering::Relaxed),
            300,
            "{name}: 1,024 checks"
        );
        assert_eq!(
            by_module.load(Ordering::Relaxed),
            512,
            "{name}: half by the module"
        );
    }
}

/// A server whose module is unloaded while a store uses it: the next check is decided by the
/// functions, in the same call, with no error, and the count goes on exactly.
#[tokio::test]
async fn a_server_that_loses_the_module_is_answered_by_the_functions() {
    let server = module_server(&["--enable-module-command", "local"]);
    let rule = Rule::new("lost", Algorithm::FixedWindow, [Tier::per_hour(5)]).unwrap();
    let limiter = Limiter::builder(rule)
        .store(store(&server, true).await)
        .build()
        .unwrap();
    for _ in 0..2 {
        let d = limiter.check("k", 1).await.unwrap();
        assert!(d.allowed());
        assert_eq!(d.source(), Source::RedisModule);
    }
    assert_eq!(server.cli(&["module", "unload", "tollgate"]), "OK");
    for _ in 0..3 {
        let d = limiter.check("k", 1).await.unwrap();
        assert!(d.allowed());
        assert_eq!(d.source(), Source::Redis);
    }
    let d = limiter.check("k", 1).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(d.remaining(), 0);
}

/// The command declares its key: `COMMAND GETKEYS` finds it, and ACL key patterns apply to it
/// as to any command.
#[tokio::test]
async fn the_modules_command_declares_its_key() {
    let server = module_server(&[]);
    let args = ["tollgate.check", "tg:a:{k1}", "x", "y", "z"];
    let getkeys: Vec<&str> = ["command", "getkeys"].into_iter().chain(args).collect();
    assert_eq!(server.cli(&getkeys), "tg:a:{k1}");
    let info = server.cli(&["command", "info", "tollgate.check"]);
    assert!(info.contains("write") && info.contains("denyoom"), "{info}");
    server.cli(&[
        "acl", "setuser", "other", "on", "nopass", "~other:*", "+@all",
    ]);
    server.cli(&["acl", "setuser", "ours", "on", "nopass", "~tg:*", "+@all"]);
    let as_user = |user: &str| {
        let mut cli: Vec<&str> = vec!["--user", user, "--pass", ""];
        cli.extend(args);
        server.cli(&cli)
    };
    assert!(as_user("other").contains("NOPERM"), "{}", as_user("other"));
    // Allowed the key, the command runs, and refuses arguments no store sends.
    assert!(
        as_user("ours").contains("not led by a NUL byte"),
        "{}",
        as_user("ours")
    );
}

/// On the server's clock, the module writes what the functions write, for checks and reports
/// alike: two stores on one server, one calling each, under two prefixes, end with the same
/// values and expiry times.
#[tokio::test]
async fn at_the_servers_time_the_module_writes_what_the_functions_write() {
    let server = module_server(&[]);
    let stores = [("m:", true), ("f:", false)];
    // A day: a window that ends between the two stores' checks would tell them apart. Keys
    // 0-3 are checked; keys 4-7 only reported (metered work), so a report writes them first.
    let rule = Rule::new("clock", Algorithm::FixedWindow, [Tier::per_day(100)]).unwrap();
    let mut limiters = Vec::new();
    for (prefix, module) in stores {
        limiters.push(prefixed(&server, prefix, module, &rule).await);
    }
    for i in 0..40 {
        for limiter in &limiters {
            let key = format!("key-{}", i % 8);
            if i % 8 < 4 {
                limiter.check(&key, 1).await.unwrap();
            } else {
                limiter.report(&key, 1).await.unwrap();
            }
        }
    }
    // Sorted by name: the functions' keys (`f:`) first.
    let mut functions = contents(&mut connection(&server).await).await;
    let module = functions.split_off(functions.len() / 2);
    assert_eq!(module.len(), 8);
    for ((f, fv, fe), (m, mv, me)) in functions.iter().zip(&module) {
        assert_eq!((&f[2..], fv, fe), (&m[2..], mv, me));
        assert!(*fe > 0);
    }
}

/// The module's writes are seen as the functions' are: the keyspace events `SET` fires
/// (`set`, and `expire` where it sets the expiry) and a `WATCH` of the key broken; a denial,
/// which writes nothing, breaks none.
#[tokio::test]
async fn the_modules_writes_fire_the_events_and_break_the_watches_of_a_set() {
    let server = module_server(&["--notify-keyspace-events", "E$g"]);
    let client = redis::Client::open(server.url()).unwrap();
    let mut listening = client.get_connection().unwrap();
    listening
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut events = listening.as_pubsub();
    events.psubscribe("__keyevent@0__:*").unwrap();
    let rule = Rule::new("seen", Algorithm::FixedWindow, [Tier::per_day(3)]).unwrap();
    for (prefix, module) in [("m:", true), ("f:", false)] {
        let limiter = prefixed(&server, prefix, module, &rule).await;
        // A new key (its expiry set), then the same key again (its expiry kept).
        for _ in 0..2 {
            let decision = limiter.check("key", 1).await.unwrap();
            let source = [Source::Redis, Source::RedisModule][usize::from(module)];
            assert_eq!(decision.source(), source);
        }
        // A transaction watching the key is aborted by the next check's write.
        let mut watching = client.get_connection().unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query(&mut watching)
            .unwrap();
        let [key] = keys.as_slice() else {
            panic!("one key under {prefix}: {keys:?}")
        };
        redis::cmd("WATCH").arg(key).exec(&mut watching).unwrap();
        limiter.check("key", 1).await.unwrap();
        let transaction: Option<(String,)> = redis::pipe()
            .atomic()
            .cmd("PING")
            .query(&mut watching)
            .unwrap();
        assert_eq!(transaction, None, "{prefix}: the watch was broken");
        // A denial writes nothing, and so leaves a watch alone.
        redis::cmd("WATCH").arg(key).exec(&mut watching).unwrap();
        assert!(!limiter.check("key", 1).await.unwrap().allowed());
        let transaction: Option<(String,)> = redis::pipe()
            .atomic()
            .cmd("PING")
            .query(&mut watching)
            .unwrap();
        assert_eq!(
            transaction,
            Some(("PONG".to_owned(),)),
            "{prefix}: a denial"
        );
    }
    // Each store's events, by event and key without its prefix, in order.
    let mut seen: [Vec<(String, String)>; 2] = Default::default();
    while let Ok(message) = events.get_message() {
        let event = message
            .get_channel_name()
            .rsplit(':')
            .next()
            .unwrap()
            .to_owned();
        let key: String = message.get_payload().unwrap();
        let which = usize::from(key.starts_with("f:"));
        seen[which].push((event, key[2..].to_owned()));
    }
    let [module, functions] = seen;
    let names: Vec<&str> = module.iter().map(|(event, _)| event.as_str()).collect();
    assert_eq!(names, ["set", "expire", "set", "set"]);
    assert_eq!(module, functions);
}

/// A key is any bytes, but a server without the module quotes a key in the error it answers,
/// and a client cannot read a quote that is not UTF-8: such keys go to the functions, even
/// where the module is, and every other key to the module.
#[tokio::test]
async fn keys_that_could_not_be_quoted_go_to_the_functions() {
    let server = module_server(&[]);
    let rule = Rule::new("quoted", Algorithm::FixedWindow, [Tier::per_hour(5)]).unwrap();
    let limiter = Limiter::builder(rule)
        .store(store(&server, true).await)
        .build()
        .unwrap();
    let long = "é".repeat(100);
    let cases: [(&[u8], Source); 5] = [
        (b"\xff\xfe", Source::Redis),
        (long.as_bytes(), Source::Redis),
        ("é".as_bytes(), Source::RedisModule),
        (b"a\0\xff", Source::RedisModule),
        (&[b'a'; 300], Source::RedisModule),
    ];
    for (key, source) in cases {
        assert_eq!(
            limiter.check(key, 1).await.unwrap().source(),
            source,
            "{key:?}"
        );
    }
}

/// A key holding words no rule wrote (set by hand, or by another program), or a value of
/// another type, never takes Redis down: its check is answered, or refused with an error (a
/// panic inside the module is caught and answered as one), a key of another type is left as
/// it is, and the server goes on deciding other keys.
#[tokio::test]
async fn a_key_no_rule_wrote_never_takes_redis_down() {
    let server = module_server(&[]);
    let store = store(&server, true).await;
    let mut redis = connection(&server).await;
    for rule in rules() {
        let limiter = Limiter::builder(rule).store(store.clone()).build().unwrap();
        let name = support::redis_keys(&limiter, "corrupt").remove(0);
        limiter.check("corrupt", 1).await.unwrap();
        let value: Vec<u8> = redis::cmd("GET")
            .arg(&name)
            .query_async(&mut redis)
            .await
            .unwrap();
        // As many words as the rule keeps, each the largest a double holds exactly.
        let huge: Vec<u8> = (0..value.len() / 8)
            .flat_map(|_| ((1u64 << 53) as f64 - 1.0).to_le_bytes())
            .collect();
        for garbage in [huge, vec![7u8; 5]] {
            let _: () = redis::cmd("SET")
                .arg(&name)
                .arg(&garbage)
                .query_async(&mut redis)
                .await
                .unwrap();
            let _ = limiter.check("corrupt", 1).await;
            let d = limiter.check("healthy", 1).await.unwrap();
            assert_eq!(d.source(), Source::RedisModule, "{}", limiter.rule().name());
        }
        // A key of another type is refused (`WRONGTYPE`: the rule's failure policy decides),
        // and left as it is.
        let _: () = redis::pipe()
            .cmd("DEL")
            .arg(&name)
            .cmd("HSET")
            .arg(&name)
            .arg("field")
            .arg("value")
            .query_async(&mut redis)
            .await
            .unwrap();
        let refused = limiter.check("corrupt", 1).await.unwrap();
        assert!(
            ![Source::Redis, Source::RedisModule].contains(&refused.source()),
            "{refused:?}"
        );
        let kept: Vec<String> = redis::cmd("HGETALL")
            .arg(&name)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert_eq!(kept, ["field", "value"], "{}", limiter.rule().name());
    }
    assert_eq!(server.cli(&["ping"]), "PONG");
}

/// A caller other than the library (the library refuses a cost above a rule's capacity before
/// calling) that sends the module or the functions a cost no tier can admit gets an error or a
/// denial at once, every algorithm, and an error for a state of 2^53 words or a time of 1e300: a module command runs to its end with Redis waiting (no script
/// timeout stops it), and the sliding window's search for the time that admits the cost
/// would never have ended. The calls are the store's own (read back from the slow log, which
/// keeps every command's arguments), with the cost raised.
#[tokio::test]
async fn a_cost_above_the_capacity_from_another_caller_is_refused_at_once() {
    let server = module_server(&["--slowlog-log-slower-than", "0"]);
    let mut redis = connection(&server).await;
    let mut all = rules();
    all.push(Rule::new("sliding", Algorithm::SlidingWindow, [Tier::per_hour(50)]).unwrap());
    for module in [true, false] {
        let store = store(&server, module).await;
        for rule in &all {
            let limiter = Limiter::builder(rule.clone())
                .store(store.clone())
                .build()
                .unwrap();
            let _: () = redis::cmd("SLOWLOG")
                .arg("RESET")
                .query_async(&mut redis)
                .await
                .unwrap();
            limiter.check("replayed", 1).await.unwrap();
            let name = support::redis_keys(&limiter, "replayed").remove(0);
            // Each entry: its id, time, duration, arguments, client address and name.
            let entries: Vec<Vec<redis::Value>> = redis::cmd("SLOWLOG")
                .arg("GET")
                .arg(-1)
                .query_async(&mut redis)
                .await
                .unwrap();
            let command = if module { "TOLLGATE.CHECK" } else { "FCALL" };
            let args = entries
                .into_iter()
                .filter_map(|mut e| redis::from_redis_value::<Vec<Vec<u8>>>(e.swap_remove(3)).ok())
                .find(|args| args[0].eq_ignore_ascii_case(command.as_bytes()))
                .unwrap_or_else(|| panic!("no {command} in the slow log"));
            // The check's header follows the key: six doubles (the module's led by a NUL
            // byte), the cost second.
            let at = args.iter().position(|a| *a == name).expect("the key") + 1;
            let mut absurd = args.clone();
            let header = &mut absurd[at];
            let cost = header.len() - 48 + 8;
            header[cost..cost + 8].copy_from_slice(&1e9f64.to_le_bytes());
            let answer = answered(&mut redis, &absurd).await;
            // The module refuses it; a function denies it (the sliding window's refuses).
            let denied = match &answer {
                Ok(redis::Value::BulkString(reply)) => reply[..8] == 0f64.to_le_bytes(),
                _ => false,
            };
            assert!(
                answer.is_err() || (!module && denied),
                "{command} of {}: {answer:?}",
                rule.name()
            );
            // A tier argument whose state would be 2^53 words (the sixth double of its first
            // tier, after the check's header; the module's follows the rule argument).
            let mut absurd = args.clone();
            let tiers = &mut absurd[at + 1 + usize::from(module)];
            let words = tiers.len() % 88 + 5 * 8;
            tiers[words..words + 8].copy_from_slice(&(2f64.powi(53) - 1.0).to_le_bytes());
            let answer = answered(&mut redis, &absurd).await;
            assert!(answer.is_err(), "{command} of {}: {answer:?}", rule.name());
            // A caller's time of 1e300 (the header's first double).
            let mut absurd = args.clone();
            let header = &mut absurd[at];
            let time = header.len() - 48;
            header[time..time + 8].copy_from_slice(&1e300f64.to_le_bytes());
            let answer = answered(&mut redis, &absurd).await;
            assert!(answer.is_err(), "{command} of {}: {answer:?}", rule.name());
        }
    }
    assert_eq!(server.cli(&["ping"]), "PONG");
}

/// The answer to the command `args` (its name first), which must come within 3 s.
async fn answered(
    redis: &mut MultiplexedConnection,
    args: &[Vec<u8>],
) -> redis::RedisResult<redis::Value> {
    let mut call = redis::cmd(&String::from_utf8_lossy(&args[0]));
    for arg in &args[1..] {
        call.arg(arg);
    }
    tokio::time::timeout(Duration::from_secs(3), call.query_async(redis))
        .await
        .unwrap_or_else(|_| panic!("{}: no answer", String::from_utf8_lossy(&args[0])))
}

/// A batch that names one key twice is decided, and written, by the module as by the
/// functions: each item in turn, the later write over the earlier.
#[tokio::test]
async fn a_batch_naming_one_key_twice_is_decided_as_by_the_functions() {
    let server = module_server(&[]);
    // Windows of a day, whose state is the same at both stores' checks.
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let rule = Rule::new("twice", algorithm.clone(), [Tier::per_day(7)]).unwrap();
        let mut decided = Vec::new();
        // Then each store once more on the other's key: the module on a value the functions
        // wrote with `SET` (a string Redis keeps otherwise than the module's), and the
        // functions on the module's.
        let runs = [
            ("m:", true, 4),
            ("f:", false, 4),
            ("f:", true, 1),
            ("m:", false, 1),
        ];
        for (prefix, module, checks) in runs {
            let limiter = prefixed(&server, prefix, module, &rule).await;
            let mut seen = Vec::new();
            for _ in 0..checks {
                let batch = [
                    tollgate::Item::new("twice", "key", 1),
                    tollgate::Item::new("twice", "key", 2),
                ];
                let decisions = limiter.check_batch(&batch).await.unwrap();
                let source = [Source::Redis, Source::RedisModule][usize::from(module)];
                assert_eq!(decisions[0].source(), source);
                seen.push(
                    decisions
                        .iter()
                        .map(|d| (d.allowed(), d.remaining()))
                        .collect::<Vec<_>>(),
                );
            }
            decided.push(seen);
        }
        assert_eq!(decided[0], decided[1], "{algorithm:?}");
        assert_eq!(decided[2], decided[3], "{algorithm:?}");
        let mut functions = contents(&mut connection(&server).await).await;
        let module = functions.split_off(functions.len() / 2);
        assert_eq!(module.len(), 1, "{algorithm:?}");
        for ((f, fv, fe), (m, mv, me)) in functions.iter().zip(&module) {
            assert_eq!((&f[2..], fv, fe), (&m[2..], mv, me), "{algorithm:?}");
        }
        server.cli(&["flushall"]);
    }
}

/// The module reads a key as a write command does (as `INCR` does): its checks count in
/// neither `keyspace_hits` nor `keyspace_misses`, where the functions' `GET` counts each.
#[tokio::test]
async fn the_modules_reads_count_as_a_write_commands() {
    let server = module_server(&[]);
    let rule = Rule::new("stats", Algorithm::FixedWindow, [Tier::per_day(100)]).unwrap();
    let counted = || {
        let stats = server.cli(&["info", "stats"]);
        ["keyspace_hits:", "keyspace_misses:"].map(|field| {
            let line = stats.lines().find(|l| l.starts_with(field)).unwrap();
            line[field.len()..].trim().parse::<u64>().unwrap()
        })
    };
    for (prefix, module, expected) in [("m:", true, [0, 0]), ("f:", false, [2, 1])] {
        server.cli(&["config", "resetstat"]);
        let limiter = prefixed(&server, prefix, module, &rule).await;
        for _ in 0..3 {
            limiter.check("key", 1).await.unwrap();
        }
        assert_eq!(counted(), expected, "{prefix}");
    }
}
