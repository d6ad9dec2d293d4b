#!/usr/bin/env python3
"""The flood benchmark: one tenant sends 50 times its limit to `tollgate serve` on Redis
strict while 50 others stay within theirs, with the cache of denials on and off
(`server.denied_cache_bytes`), and without the flood, interleaved round by round in one run.
The server runs on the second core; Redis and both load generators on the first. Reports, per
mode, the
Redis calls per denied check of the flooding tenant (Redis's own command statistics, less one
call per other check) and the other tenants' p99 latency (median of the rounds).

Usage: benches/service/flood.py [--seconds 5] [--rounds 3]  (after `benches/service/run`
has built the release binary, or `cargo build --release -p tollgate-server --bin tollgate`).
"""
import argparse
import os
import re
import statistics
import subprocess
import tempfile

from bench import free_port, pinned, wait_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOLLGATE = os.path.join(ROOT, "target/release/tollgate")

LIMIT = 100  # per second and tenant
FLOOD = 50 * LIMIT  # the flooding tenant's rate
TENANTS = 50
NORMAL = TENANTS * LIMIT // 2  # the others, at half their limit each

RULES = """
server: {{ http: 127.0.0.1:{port}, grpc: 127.0.0.1:{grpc}, denied_cache_bytes: {cache} }}
store: {{ kind: redis, url: "redis://127.0.0.1:{redis}" }}
rules:
  - id: api
    match: {{ path: "/v1/api/**" }}
    key: [header:x-tenant]
    tiers: [{{ limit: {limit}, period: 1s }}]
"""


def redis_calls(port):
    out = subprocess.run(["redis-cli", "-p", str(port), "INFO", "commandstats"],
                         capture_output=True, text=True, check=True).stdout
    return sum(int(m) for m in re.findall(r"cmdstat_(?:fcall|evalsha):calls=(\d+)", out))


def bench(server, tenant, keys, rate, seconds):
    return subprocess.Popen(
        pinned(0, [TOLLGATE, "bench", "--server", server, "--path", "/v1/api/x",
                   "-H", f"x-tenant: {tenant}", "--keys", str(keys), "--rate", str(rate),
                   "--duration", f"{seconds}s", "--connections", "16"]),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def parsed(out):
    answers = re.search(r"allowed (\d+), denied (\d+), failed (\d+)", out)
    p99 = re.search(r"p99 ([\d.]+) ms", out)
    if not answers or not p99:
        raise SystemExit(f"unexpected bench output:\n{out}")
    allowed, denied, failed = map(int, answers.groups())
    return allowed, denied, failed, float(p99.group(1))


def round_of(mode, redis, seconds):
    port, grpc = free_port(), free_port()
    cache = 4194304 if mode == "on" else 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rules.yaml")
        with open(path, "w") as f:
            f.write(RULES.format(port=port, grpc=grpc, cache=cache, redis=redis, limit=LIMIT))
        server = subprocess.Popen(pinned(1, [TOLLGATE, "serve", "--config", path]),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port)
            url = f"http://127.0.0.1:{port}"
            before = redis_calls(redis)
            flood = bench(url, "flood", 1, FLOOD, seconds) if mode != "no flood" else None
            normal = bench(url, "t{key}", TENANTS, NORMAL, seconds)
            f_allowed, f_denied, f_failed = 0, 0, 0
            if flood:
                f_allowed, f_denied, f_failed, _ = parsed(flood.communicate()[0])
            n_allowed, n_denied, n_failed, n_p99 = parsed(normal.communicate()[0])
            calls = redis_calls(redis) - before
        finally:
            server.terminate()
            server.wait()
    others = n_allowed + n_denied + f_allowed
    return {
        "calls_per_denial": max(calls - others, 0) / f_denied if f_denied else float("nan"),
        "flood_denied": f_denied,
        "normal_p99": n_p99,
        "normal_denied": n_denied,
        "failed": f_failed + n_failed,
        "calls": calls,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    redis = free_port()
    data = tempfile.mkdtemp()
    server = subprocess.Popen(pinned(0, ["redis-server", "--port", str(redis), "--bind", "127.0.0.1",
                                         "--save", "", "--appendonly", "no", "--dir", data]),
                              stdout=subprocess.DEVNULL)
    try:
        wait_port(redis)
        results = {"on": [], "off": [], "no flood": []}
        for _ in range(args.rounds):
            for mode in ("on", "off", "no flood"):
                results[mode].append(round_of(mode, redis, args.seconds))
    finally:
        server.terminate()
        server.wait()
    print(f"One tenant at {FLOOD} checks/s against {LIMIT}/s, {TENANTS} others at {NORMAL} "
          f"checks/s in all; {args.rounds} rounds of {args.seconds} s, medians.\n")
    print("| denied cache | Redis calls per denied check (flooding tenant) | "
          "flooding tenant's denials | Redis calls in all | other tenants' p99 | other tenants denied | failed |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mode in ("on", "off", "no flood"):
        rounds = results[mode]
        med = lambda k: statistics.median(r[k] for r in rounds)
        per_denial = med("calls_per_denial")
        per_denial = "–" if per_denial != per_denial else f"{per_denial:.4f}"  # NaN: no flood
        print(f"| {mode} | {per_denial} | {med('flood_denied'):.0f} | "
              f"{med('calls'):.0f} | {med('normal_p99'):.2f} ms | {med('normal_denied'):.0f} | "
              f"{sum(r['failed'] for r in rounds)} |")


if __name__ == "__main__":
    main()
