//! Load harness for Redis-backed limiting, side by side in one run on one local Redis that it
//! starts itself: tollgate's Redis store, limitador's Redis storage, the ceiling —
//! `redis-benchmark` sending a trivial `EVALSHA` — and the same trivial `EVALSHA` sent by
//! redis-rs, the client tollgate is built on.
//!
//! For each number of concurrent callers: decisions per second, p50 and p99 latency, and the
//! Redis commands per decision (function and script calls, i.e. round trips; and every command including
//! those a script runs). The client runs on one thread, like redis-benchmark, so Redis keeps
//! the other core of a two-core machine.
//!
//! Run: `benches/redis/run` (or `cargo run --release -- --seconds 3 --rounds 3 --callers
//! 1,16,256`); `--systems tollgate` measures one system alone, e.g. under a profiler;
//! `--systems metered` measures metered work instead: a check, a report, and a reservation
//! with its commit (one settled request), side by side, in a table of its own. Each
//! system's row is its median round, rounds interleaving the systems. `--connections N` sets
//! tollgate's pipelined connections (default: the library's, one).

use std::collections::HashMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hdrhistogram::Histogram;
use limitador::AsyncRateLimiter;
use limitador::limit::{Context as Ctx, Expression, Limit};
use limitador::storage::redis::AsyncRedisStorage;
use tollgate::{Algorithm, Limiter, RedisStore, Rule, Tier};

/// One measured run.
struct Run {
    system: String,
    decisions_per_second: f64,
    p50_us: f64,
    p99_us: f64,
    /// Function, script and module calls (FCALL/EVALSHA/EVAL, tollgate's module's
    /// commands) per decision: the round trips.
    scripts: f64,
    /// Every command Redis ran per decision, including those inside scripts.
    commands: f64,
    /// CPU time Redis spent per decision (user and system), in µs.
    redis_cpu_us: f64,
}

/// CPU seconds the Redis server has used so far.
fn redis_cpu(port: u16) -> Result<f64> {
    let stats = info(port)?;
    Ok(stats.get("used_cpu_user").unwrap_or(&0.0) + stats.get("used_cpu_sys").unwrap_or(&0.0))
}

struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A redis-server of this harness's own, loading tollgate's Redis module from `module` if
/// given.
fn start_redis(module: Option<&str>) -> Result<Server> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let dir = tempfile::tempdir()?;
    // Redis on the second core, the client (this process, pinned by `run`) on the first.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut command = if cores >= 2 && Command::new("taskset").arg("-V").output().is_ok() {
        let mut taskset = Command::new("taskset");
        taskset.args(["-c", "1", "redis-server"]);
        taskset
    } else {
        Command::new("redis-server")
    };
    let child = command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(module.map(|path| ["--loadmodule", path]).into_iter().flatten())
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .context("redis-server must be installed")?;
    let server = Server {
        child,
        port,
        _dir: dir,
    };
    for _ in 0..200 {
        if cli(port, &["ping"]).is_ok_and(|r| r == "PONG") {
            return Ok(server);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("redis-server did not start")
}

fn cli(port: u16, args: &[&str]) -> Result<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `field:value` lines of an INFO section, and `cmdstat_x:calls=N,...` as `x` -> N.
fn info(port: u16) -> Result<HashMap<String, f64>> {
    let text = cli(port, &["info", "all"])?;
    let mut map = HashMap::new();
    for line in text.lines() {
        if let Some((name, rest)) = line.split_once(':') {
            if let Some(cmd) = name.strip_prefix("cmdstat_") {
                let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="));
                map.insert(cmd.to_string(), calls.unwrap_or("0").parse().unwrap_or(0.0));
            } else if let Ok(v) = rest.parse() {
                map.insert(name.to_string(), v);
            }
        }
    }
    Ok(map)
}

/// Runs `callers` concurrent loops of `decide` for `seconds`; counts and times decisions.
async fn drive<F, Fut>(
    system: &str,
    port: u16,
    callers: usize,
    seconds: u64,
    decide: F,
) -> Result<Run>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    cli(port, &["flushall"])?;
    // Warm up connections and scripts, then count from a clean slate.
    for i in 0..100 {
        decide(i, 0).await;
    }
    cli(port, &["config", "resetstat"])?;
    let cpu_before = redis_cpu(port)?;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    // Callers are tasks of the one-thread runtime, like the connection's own task, so waking
    // one is a push onto the run queue.
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let decide = decide.clone();
        tasks.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new(3).unwrap();
            let mut n = 0u64;
            while Instant::now() < deadline {
                let started = Instant::now();
                decide(caller, n).await;
                histogram
                    .record(started.elapsed().as_micros() as u64)
                    .unwrap();
                n += 1;
            }
            histogram
        }));
    }
    let started = Instant::now();
    let mut histograms = Vec::new();
    for task in tasks {
        histograms.push(task.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut merged = Histogram::<u64>::new(3).unwrap();
    for h in &histograms {
        merged.add(h).unwrap();
    }
    let stats = info(port)?;
    let decisions = merged.len() as f64;
    let redis_cpu_us = (redis_cpu(port)? - cpu_before) * 1e6 / decisions;
    let calls = ["fcall", "evalsha", "eval", "tollgate.check", "tollgate.batch"];
    let scripts: f64 = calls
        .iter()
        .map(|c| stats.get(*c).unwrap_or(&0.0))
        .sum();
    Ok(Run {
        system: system.to_string(),
        decisions_per_second: decisions / elapsed,
        p50_us: merged.value_at_quantile(0.5) as f64,
        p99_us: merged.value_at_quantile(0.99) as f64,
        scripts: scripts / decisions,
        commands: stats.get("total_commands_processed").unwrap_or(&0.0) / decisions,
        redis_cpu_us,
    })
}

const KEYS: u64 = 10_000;

fn key(caller: usize, n: u64) -> String {
    format!("user-{}", (caller as u64 * 7_919 + n) % KEYS)
}

/// tollgate with `algorithm`, at limitador's limit: a billion per minute; by its Lua
/// functions, or with `module` by its Redis module (which the server must load).
async fn tollgate(
    port: u16,
    algorithm: Algorithm,
    module: bool,
    callers: usize,
    seconds: u64,
) -> Result<Run> {
    let connections: usize = argument("--connections", "0").parse()?;
    let (system, source) = match module {
        false => (format!("tollgate ({algorithm:?})"), tollgate::Source::Redis),
        true => (
            format!("tollgate, module ({algorithm:?})"),
            tollgate::Source::RedisModule,
        ),
    };
    let rule = Rule::new("bench", algorithm, [Tier::per_minute(1_000_000_000)])?;
    let store = RedisStore::builder(&format!("redis://127.0.0.1:{port}"))
        .connections(connections.max(1))
        .timeout(Duration::from_secs(5))
        .module(module)
        .build()
        .await?;
    let limiter = Arc::new(Limiter::builder(rule).store(store).build()?);
    drive(&system, port, callers, seconds, move |caller, n| {
        let limiter = limiter.clone();
        async move {
            let decision = limiter.check(key(caller, n), 1).await.unwrap();
            assert!(decision.allowed() && decision.source() == source);
        }
    })
    .await
}

/// Metered work on tollgate's Redis store (a fixed window, a billion per minute): a check of
/// 10, a report of 7, or a reservation of 10 committed at 7; each "decision" is one settled
/// request.
async fn metered(port: u16, kind: &'static str, callers: usize, seconds: u64) -> Result<Run> {
    let rule = Rule::new("bench", Algorithm::FixedWindow, [Tier::per_minute(1_000_000_000)])?;
    // By the functions, as the table was measured, whether or not the server loads the module.
    let store = RedisStore::builder(&format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_secs(5))
        .module(false)
        .build()
        .await?;
    let limiter = Arc::new(Limiter::builder(rule).store(store).build()?);
    drive(kind, port, callers, seconds, move |caller, n| {
        let limiter = limiter.clone();
        async move {
            let key = key(caller, n);
            match kind {
                "check of 10" => {
                    let decision = limiter.check(&key, 10).await.unwrap();
                    assert!(decision.allowed() && decision.source() == tollgate::Source::Redis);
                }
                "report of 7" => {
                    limiter.report(&key, 7).await.unwrap();
                }
                _ => {
                    let item = [tollgate::Item::new("bench", &key, 10)];
                    let reserved = limiter.reserve(&item, None).await.unwrap();
                    limiter.commit(reserved.id().unwrap(), 7).await.unwrap();
                }
            }
        }
    })
    .await
}

/// The metered systems, in the order of their table: the check first, the ratios' base.
const METERED: [&str; 3] = ["check of 10", "report of 7", "reserve 10, commit 7"];

async fn limitador(port: u16, callers: usize, seconds: u64) -> Result<Run> {
    let storage = AsyncRedisStorage::new(&format!("redis://127.0.0.1:{port}")).await?;
    let limiter = AsyncRateLimiter::new_with_storage(Box::new(storage));
    let variable = Expression::parse("user").map_err(|e| anyhow::anyhow!("{e:?}"))?;
    limiter.add_limit(Limit::new("bench", 1_000_000_000, 60, [], [variable]));
    let limiter = Arc::new(limiter);
    let namespace: limitador::limit::Namespace = "bench".into();
    drive(
        "limitador (Redis storage)",
        port,
        callers,
        seconds,
        move |caller, n| {
            let (limiter, namespace) = (limiter.clone(), namespace.clone());
            async move {
                let values = HashMap::from([("user".to_string(), key(caller, n))]);
                let ctx = Ctx::from(values);
                let result = limiter
                    .check_rate_limited_and_update(&namespace, &ctx, 1)
                    .await
                    .unwrap();
                assert!(!result.limited);
            }
        },
    )
    .await
}

/// Scripts sent the way tollgate sends its checks: by redis-rs, on one multiplexed connection
/// that every caller shares, each call with one key (cycling as tollgate's do).
const FLOORS: [(&str, &str); 2] = [
    // The ceiling's trivial script: what any client on redis-rs can reach.
    ("client floor: redis-rs EVALSHA `return 1`", "return 1"),
    // What every exact check on the server's clock must do, deciding nothing: read the clock,
    // read the key's state, write it back with its TTL.
    (
        "check floor: redis-rs EVALSHA of TIME, GET, SET PX",
        "local t = redis.call('TIME') redis.call('GET', KEYS[1]) \
         redis.call('SET', KEYS[1], t[1], 'PX', 60000) return 1",
    ),
];

async fn floor(
    port: u16,
    (system, code): (&str, &str),
    callers: usize,
    seconds: u64,
) -> Result<Run> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let connection = client.get_multiplexed_async_connection().await?;
    let script = redis::Script::new(code);
    drive(system, port, callers, seconds, move |caller, n| {
        let (mut connection, script) = (connection.clone(), script.clone());
        async move {
            let invocation = script.key(key(caller, n));
            let one: i64 = invocation.invoke_async(&mut connection).await.unwrap();
            assert_eq!(one, 1);
        }
    })
    .await
}

/// redis-benchmark running a trivial script: what Redis itself allows.
fn ceiling(port: u16, callers: usize, seconds: u64) -> Result<Run> {
    let sha = cli(port, &["script", "load", "return 1"])?;
    let requests = (if callers == 1 { 12_000 } else { 60_000 }) * seconds;
    cli(port, &["config", "resetstat"])?;
    let cpu_before = redis_cpu(port)?;
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args([
            "-c",
            &callers.to_string(),
            "-n",
            &requests.to_string(),
            "--csv",
        ])
        .args(["evalsha", &sha, "0"])
        .output()
        .context("redis-benchmark must be installed (redis-tools)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text.lines().last().context("no redis-benchmark output")?;
    let fields: Vec<f64> = row
        .split(',')
        .skip(1)
        .map(|f| f.trim_matches('"').parse().unwrap_or(0.0))
        .collect();
    let stats = info(port)?;
    let decisions = requests as f64;
    let redis_cpu_us = (redis_cpu(port)? - cpu_before) * 1e6 / decisions;
    Ok(Run {
        system: "ceiling: redis-benchmark EVALSHA `return 1`".into(),
        decisions_per_second: fields[0],
        p50_us: fields[3] * 1_000.0,
        p99_us: fields[5] * 1_000.0,
        scripts: stats.get("evalsha").unwrap_or(&0.0) / decisions,
        commands: stats.get("total_commands_processed").unwrap_or(&0.0) / decisions,
        redis_cpu_us,
    })
}

/// The table of metered work: per number of callers, each kind's median round.
async fn metered_table(port: u16, callers: &[usize], rounds: usize, seconds: u64) -> Result<()> {
    println!(
        "| callers | tollgate on Redis | settled/s | p50 | p99 | calls/settled | commands/settled | Redis CPU/settled | rate vs check |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for &n in callers {
        let mut rounds_of: Vec<Vec<Run>> = METERED.iter().map(|_| Vec::new()).collect();
        for _ in 0..rounds {
            for (i, kind) in METERED.into_iter().enumerate() {
                rounds_of[i].push(metered(port, kind, n, seconds).await?);
            }
        }
        let medians: Vec<Run> = rounds_of
            .into_iter()
            .map(|mut all| {
                all.sort_by(|a, b| a.decisions_per_second.total_cmp(&b.decisions_per_second));
                all.swap_remove(all.len() / 2)
            })
            .collect();
        let check = medians[0].decisions_per_second;
        for run in &medians {
            println!(
                "| {n} | {} | {:.0} | {:.0} µs | {:.0} µs | {:.2} | {:.2} | {:.1} µs | {:.2} |",
                run.system,
                run.decisions_per_second,
                run.p50_us,
                run.p99_us,
                run.scripts,
                run.commands,
                run.redis_cpu_us,
                run.decisions_per_second / check,
            );
        }
    }
    Ok(())
}

fn argument(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let seconds: u64 = argument("--seconds", "3").parse()?;
    let callers: Vec<usize> = argument("--callers", "1,16,256")
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let systems = argument("--systems", "tollgate,limitador,floor,ceiling");
    let rounds: usize = argument("--rounds", "3").parse()?;
    let module = argument("--module", "");
    let module = (!module.is_empty()).then_some(module.as_str());
    let server = start_redis(module)?;
    if systems == "metered" {
        return metered_table(server.port, &callers, rounds, seconds).await;
    }
    println!(
        "| callers | system | decisions/s | p50 | p99 | calls/decision | commands/decision | Redis CPU/decision | throughput vs limitador | vs ceiling |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for &n in &callers {
        // Rounds interleave the systems, so that a machine slowing down for a while slows
        // each of them; each system reports its median round.
        let mut rounds_of: Vec<Vec<Run>> = Vec::new();
        for _ in 0..rounds {
            let mut runs = Vec::new();
            if systems.contains("tollgate") {
                for algorithm in [Algorithm::Gcra, Algorithm::FixedWindow] {
                    runs.push(tollgate(server.port, algorithm.clone(), false, n, seconds).await?);
                    if module.is_some() {
                        runs.push(tollgate(server.port, algorithm, true, n, seconds).await?);
                    }
                }
            }
            if systems.contains("limitador") {
                runs.push(limitador(server.port, n, seconds).await?);
            }
            if systems.contains("floor") {
                for system in FLOORS {
                    runs.push(floor(server.port, system, n, seconds).await?);
                }
            }
            if systems.contains("ceiling") {
                runs.push(ceiling(server.port, n, seconds)?);
            }
            for (i, run) in runs.into_iter().enumerate() {
                match rounds_of.get_mut(i) {
                    Some(all) => all.push(run),
                    None => rounds_of.push(vec![run]),
                }
            }
        }
        let medians: Vec<Run> = rounds_of
            .into_iter()
            .map(|mut all| {
                all.sort_by(|a, b| a.decisions_per_second.total_cmp(&b.decisions_per_second));
                all.swap_remove(all.len() / 2)
            })
            .collect();
        let rate_of = |name: &str| {
            let found = medians.iter().find(|r| r.system.starts_with(name));
            found.map_or(f64::NAN, |r| r.decisions_per_second)
        };
        let (peer, roof) = (rate_of("limitador"), rate_of("ceiling"));
        for run in &medians {
            println!(
                "| {n} | {} | {:.0} | {:.0} µs | {:.0} µs | {:.2} | {:.2} | {:.1} µs | {:.2}x | {:.0}% |",
                run.system,
                run.decisions_per_second,
                run.p50_us,
                run.p99_us,
                run.scripts,
                run.commands,
                run.redis_cpu_us,
                run.decisions_per_second / peer,
                100.0 * run.decisions_per_second / roof,
            );
        }
    }
    Ok(())
}
