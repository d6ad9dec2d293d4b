#!/usr/bin/env python3
"""Drives the service benchmark (see `run`): starts each system on a free loopback port, runs
wrk against it for a few seconds per round, interleaving systems round by round, and prints
each system's median round as a Markdown table, with its ratios to the ceiling and to the
peer taken within each round (median and range over the rounds).

Every system gets the same request shape: a POST of a small JSON body naming one of 10,000
tenants, limited to a billion per minute, so that every check is admitted and writes state.
Servers run on the second core; wrk and Redis (outside the server under test, as in
production) on the first (when taskset exists).
"""
import argparse
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOLLGATE = os.path.join(ROOT, "target/release/tollgate")
TRIVIAL = os.path.join(ROOT, "target/release/examples/trivial")
MODULE = os.path.join(ROOT, "target/release/libtollgate_redis_module.so")
RLS_LOAD = os.path.join(ROOT, "target/release/examples/rls_load")

RULES = """
server: {{ http: 127.0.0.1:{port}, grpc: 127.0.0.1:{grpc} }}
store: {store}
rules:
  - id: api
    match: {{ methods: [POST], path: "/v1/**" }}
    key: [header:x-tenant]
    algorithm: gcra
    tiers: [{{ limit: 1000000000, period: 1m }}]
"""

ENVOY = """
domain: bench
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 1000000000 }
"""

WRK_SCRIPT = """
-- Every request is rendered once, in init: wrk's own work per request is then a table
-- lookup, and its core (shared with Redis) is left to the network.
local requests, n = {}, 0
local function render(tenant)
  if BODY == "LAYERED" then
    return wrk.format("POST", PATH, {["content-type"] = "application/json", ["x-tenant"] = "t" .. tenant},
                      '{"request": {"method": "POST", "path": "/v1/items"}}')
  end
  if BODY == "" then
    return wrk.format("GET", PATH, {["x-original-uri"] = "/v1/items", ["x-original-method"] = "POST",
                                    ["x-tenant"] = "t" .. tenant})
  end
  return wrk.format("POST", PATH, {["content-type"] = "application/json"}, string.format(BODY, tenant))
end
-- A steady load: each connection waits after an answer before its next request, a whole
-- number of ms drawn evenly from 0 to 2 PAUSE, so that connections do not fall into step.
if PAUSE and PAUSE > 0 then
  delay = function() return math.random(0, 2 * PAUSE) end
end
init = function(args)
  for tenant = 0, 9999 do
    requests[tenant] = render(tenant)
  end
end
request = function()
  n = (n + 7919) % 10000
  return requests[n]
end
"""

def tollgate_systems(redis_port, module_port):
    """(name, store, extra arguments) of each `tollgate serve` under test: the memory store,
    the same with the console on and not open (an admin token turns it on), Redis strict, and
    Redis strict on a server that loads tollgate's Redis module."""
    return [
        ("tollgate, memory store", "{ kind: memory }", []),
        ("tollgate, memory store, console on", "{ kind: memory }", ["--admin-token", "bench"]),
        ("tollgate, Redis strict",
         f"{{ kind: redis, url: 'redis://127.0.0.1:{redis_port}', mode: strict, timeout: 1s }}", []),
        ("tollgate, Redis strict, module",
         f"{{ kind: redis, url: 'redis://127.0.0.1:{module_port}', mode: strict, timeout: 1s }}", []),
    ]


TOLLGATE_BODY = '{"request": {"method": "POST", "path": "/v1/items", "headers": {"x-tenant": "t%d"}}}'
CEILING_BODY = TOLLGATE_BODY
PEER_BODY = '{"key": "t%d", "max_burst": 1000000000, "count_per_period": 1000000000, "period": 60}'


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def pinned(core, argv):
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", str(core)] + argv
    return argv


class System:
    def __init__(self, name, argv, port, path, body, env=None, grpc=None, redis=None):
        self.name, self.argv, self.port, self.path, self.body = name, argv, port, path, body
        self.http_name = name
        self.env, self.grpc = env, grpc
        # The redis-server process this system checks against, if any.
        self.redis = redis
        self.proc = None
        self.rounds = []
        self.grpc_rounds = []
        # Rounds at a steady load (see --pause-ms), for the systems that answer checks.
        self.steady = body != "LAYERED"
        self.steady_rounds = []
        self.grpc_steady_rounds = []

    def start(self):
        if self.argv is None:
            return
        self.proc = subprocess.Popen(pinned(1, self.argv), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=self.env)
        wait_port(self.port)

    def stop(self):
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def cpu_seconds(pid):
    """User and system CPU time of process `pid`, all threads, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(system, seconds, connections, workdir, pause_ms=0):
    script = os.path.join(workdir, f"{system.port}.lua")
    with open(script, "w") as f:
        f.write(f"BODY = [[{system.body}]]\nPATH = [[{system.path}]]\nPAUSE = {pause_ms}\n" + WRK_SCRIPT)
    url = f"http://127.0.0.1:{system.port}"
    cpu, client, redis = cpu_seconds(system.pid), client_usage(), redis_seconds(system)
    out = subprocess.run(pinned(0, ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency",
                                    "-s", script, url]), capture_output=True, text=True, check=True).stdout
    cpu, redis = cpu_seconds(system.pid) - cpu, redis_seconds(system) - redis
    client = [after - before for after, before in zip(client_usage(), client)]
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", out, re.M))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise SystemExit(f"{system.name}: {errors.group(1)} answers were not 2xx:\n{out}")
    per_request = lambda x: x / requests
    return (rate, micros(lat["50"]), micros(lat["99"]), per_request(cpu * 1e6),
            per_request(client[1]), per_request(client[0] * 1e6), per_request(redis * 1e6))


def failed_over(system):
    """The decisions a tollgate server under test made by its rules' failure policy, and
    the errors its store met, from its /metrics: a store that failed would be answered by the
    policy (an open rule admits), and its rounds would measure that, not the store."""
    with urllib.request.urlopen(f"http://127.0.0.1:{system.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(v) for _, v in
               re.findall(r"^(tollgate_policy_decisions_total|tollgate_store_errors_total)\S* (\S+)$",
                          text, re.M))


def client_usage():
    """CPU seconds (user and system) and voluntary context switches of the waited-for
    children, the load generators so far: what wrk spent, and how often it ran out of answers
    to read and slept."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw


def redis_seconds(system):
    """CPU seconds of the system's redis-server so far (0 for a system without one)."""
    return cpu_seconds(system.redis) if system.redis else 0.0


def rls(system, seconds, connections, pause_ms=0, streams=1):
    """`connections` calls in flight, `streams` of them on each HTTP/2 connection."""
    cpu, redis, client = cpu_seconds(system.pid), redis_seconds(system), client_usage()[0]
    out = subprocess.run(pinned(0, [RLS_LOAD, f"http://127.0.0.1:{system.grpc}", str(connections // streams),
                                    str(seconds), "10000", str(pause_ms), str(streams)]),
                         capture_output=True, text=True, check=True).stdout
    cpu, redis = cpu_seconds(system.pid) - cpu, redis_seconds(system) - redis
    client = client_usage()[0] - client
    rate, p50, p99 = (float(x) for x in out.split())
    calls = rate * seconds
    return rate, p50, p99, cpu * 1e6 / calls, redis * 1e6 / calls, client * 1e6 / calls


def micros(text):
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()
    return float(value) * {"us": 1, "ms": 1_000, "s": 1_000_000}[unit]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    # Latency away from saturation: each connection waits this long after an answer, on
    # average (drawn evenly from 0 to twice as long).
    parser.add_argument("--pause-ms", type=int, default=2)
    parser.add_argument("--steady-rounds", type=int, default=3)
    # At the steady load, gRPC calls share connections as Envoy's do: this many on each.
    parser.add_argument("--steady-streams", type=int, default=16)
    parser.add_argument("--throttlecrab", required=True)
    # For an A/B of a few systems over many rounds: keep only the systems whose names contain
    # one of these (the ceiling and the peer are always kept, as the ratios need them).
    parser.add_argument("--only", action="append", default=[])
    args = parser.parse_args()
    workdir = tempfile.mkdtemp()
    redis_port = free_port()
    # Redis is outside the server under test, as in production: it shares the load
    # generator's core, and each server has the other core to itself.
    redis = subprocess.Popen(pinned(0, ["redis-server", "--bind", "127.0.0.1", "--port", str(redis_port),
                                        "--save", "", "--appendonly", "no", "--dir", workdir]),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Another, beside it, with tollgate's Redis module (systems take turns: one is busy at a time).
    module_port = free_port()
    with_module = subprocess.Popen(pinned(0, ["redis-server", "--bind", "127.0.0.1", "--port", str(module_port),
                                              "--save", "", "--appendonly", "no", "--dir", workdir,
                                              "--loadmodule", MODULE]),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(redis_port)
    wait_port(module_port)
    systems = []
    port, grpc, wrapped, bare = free_port(), free_port(), free_port(), free_port()
    systems.append(System("ceiling: axum / tonic answering a constant",
                          [TRIVIAL, f"127.0.0.1:{port}", f"127.0.0.1:{grpc}", f"127.0.0.1:{wrapped}",
                           f"127.0.0.1:{bare}"], port, "/v1/check", CEILING_BODY, grpc=grpc))
    # The same handler with no router in front, as tollgate serves its two checks.
    systems.append(System("the ceiling's handler without axum's router", None, bare, "/v1/check", CEILING_BODY))
    # The ceiling's own handler behind a layer that changes nothing (what axum charges for
    # any layer), and behind tollgate's tower layer, in the same process.
    systems.append(System("the ceiling behind a do-nothing tower layer", None, port, "/v1/identity",
                          "LAYERED"))
    # The floor of any layer that writes the rate limit fields: the same fields, as constants.
    systems.append(System("the ceiling behind a layer adding constant rate limit fields", None, port,
                          "/v1/fields", "LAYERED"))
    systems.append(System("the ceiling behind tollgate's tower layer", None, port, "/v1/layered",
                          "LAYERED"))
    # The ceiling's whole app wrapped in tollgate's layer from outside the router.
    systems.append(System("the ceiling's app wrapped in tollgate's layer", None, wrapped, "/v1/check",
                          "LAYERED"))
    for name, store, extra in tollgate_systems(redis_port, module_port):
        port, grpc = free_port(), free_port()
        config = os.path.join(workdir, f"{port}.yaml")
        with open(config, "w") as f:
            f.write(RULES.format(port=port, grpc=grpc, store=store))
        envoy = os.path.join(workdir, f"{port}-envoy.yaml")
        with open(envoy, "w") as f:
            f.write(ENVOY)
        env = dict(os.environ, RUST_LOG="warn")
        uses = None
        if "redis" in store:
            uses = with_module.pid if str(module_port) in store else redis.pid
        systems.append(System(name + ", /v1/check (JSON)", [TOLLGATE, "serve", "--config", config, envoy] + extra,
                              port, "/v1/check", TOLLGATE_BODY, env, grpc=grpc, redis=uses))
        # The same server's nginx auth_request endpoint: headers in, 204 and headers out.
        systems.append(System(name + ", /v1/auth (nginx)", None, port, "/v1/auth", "", redis=uses))
    port = free_port()
    systems.append(System("peer: throttlecrab-server (HTTP)",
                          [args.throttlecrab, "--http", "--http-port", str(port), "--http-host", "127.0.0.1"],
                          port, "/throttle", PEER_BODY))
    if args.only:
        keep = lambda s: s is systems[0] or s is systems[-1] or any(o in s.name for o in args.only)
        # A system without a command runs in the process of the one before it: a kept one
        # whose process-starting system is left out starts that process itself.
        for before, s in zip(systems, systems[1:]):
            if keep(s) and s.argv is None and not keep(before):
                s.argv, s.env, s.grpc = before.argv, before.env, before.grpc
                before.argv = before.grpc = None
        systems = [s for s in systems if keep(s)]
    try:
        for s in systems:
            s.start()
            # A system without a command is served by the process of the one before it.
            s.pid = s.proc.pid if s.proc else pid
            pid = s.pid
            wrk(s, 1, args.connections, workdir)  # warm up
        for _ in range(args.rounds):
            for s in systems:
                s.rounds.append(wrk(s, args.seconds, args.connections, workdir))
            for s in systems:
                if s.grpc:
                    s.grpc_rounds.append(rls(s, args.seconds, args.connections))
        for _ in range(args.steady_rounds):
            for s in systems:
                if s.steady:
                    s.steady_rounds.append(wrk(s, args.seconds, args.connections, workdir, args.pause_ms))
            for s in systems:
                if s.grpc:
                    s.grpc_steady_rounds.append(rls(s, args.seconds, args.connections, args.pause_ms,
                                                    args.steady_streams))
        for s in systems:
            if s.proc and s.name.startswith("tollgate"):
                failed = failed_over(s)
                if failed:
                    raise SystemExit(f"{s.name}: {failed:.0f} decisions by the failure policy or "
                                     "store errors: its rounds did not measure the store")
    finally:
        for s in systems:
            s.stop()
        redis.terminate()
        with_module.terminate()
    print(f"HTTP (wrk, {args.connections} connections, {args.rounds} rounds of {args.seconds} s)\n")
    print("| system | requests/s | p50 | p99 | vs ceiling | vs peer | vs memory store, same endpoint |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    ceiling, peer = systems[0], systems[-1]
    for s in systems:
        rate, p50, p99 = (median(r[i] for r in s.rounds) for i in range(3))
        endpoint = s.name.split(", ")[-1]
        same = [m for m in systems if m.name == f"tollgate, memory store, {endpoint}"]
        versus = ratio(s.rounds, same[0].rounds, "{:.0%}") if same else ""
        print(f"| {s.name} | {rate:,.0f} | {p50:.0f} µs | {p99:.0f} µs | "
              f"{ratio(s.rounds, ceiling.rounds, '{:.0%}')} | {ratio(s.rounds, peer.rounds, '{:.2f}x')} | {versus} |")
    # The server's CPU time per request: what a request costs the server, whatever the load
    # generator on the other core pays to parse the answer. Ratios as requests per CPU second.
    print(f"\nCPU time per request (user and system, all threads; same rounds)\n")
    # wrk sleeps when every connection waits for its answer; waking it again costs the server's
    # kernel (an interprocessor interrupt when its core is idle), so a server whose answers
    # trickle out pays more per request than one whose answers leave in bursts. wrk and Redis
    # share the first core: their CPU per request says how busy it is.
    print("| system | server CPU per request | vs ceiling | vs peer | wrk's sleeps per request "
          "| wrk CPU per request | Redis CPU per request |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    cost = lambda rounds: [(1 / r[3],) for r in rounds]
    for s in systems:
        redis_cpu = f"{median(r[6] for r in s.rounds):.2f} µs" if s.redis else ""
        print(f"| {s.name} | {median(r[3] for r in s.rounds):.2f} µs | "
              f"{ratio(cost(s.rounds), cost(ceiling.rounds), '{:.0%}')} | "
              f"{ratio(cost(s.rounds), cost(peer.rounds), '{:.2f}x')} | {median(r[4] for r in s.rounds):.3f} | "
              f"{median(r[5] for r in s.rounds):.2f} µs | {redis_cpu} |")
    grpc = [s for s in systems if s.grpc]
    for s in grpc[1:]:
        s.name = s.name.replace(", /v1/check (JSON)", "").replace(", /v1/auth (nginx)", "")
    print(f"\ngRPC ShouldRateLimit (rls_load, {args.connections} connections, one request in flight on each)\n")
    print("| system | requests/s | p50 | p99 | server CPU per request | client CPU per request "
          "| Redis CPU per request | vs ceiling | vs memory store |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for s in grpc:
        rate, p50, p99, cpu, redis_cpu, client = (median(r[i] for r in s.grpc_rounds) for i in range(6))
        redis_cpu = f"{redis_cpu:.1f} µs" if s.redis else ""
        print(f"| {s.name} | {rate:,.0f} | {p50:.0f} µs | {p99:.0f} µs | {cpu:.1f} µs | {client:.1f} µs | "
              f"{redis_cpu} | {ratio(s.grpc_rounds, grpc[0].grpc_rounds, '{:.0%}')} | "
              f"{ratio(s.grpc_rounds, grpc[1].grpc_rounds, '{:.0%}')} |")
    if args.steady_rounds:
        # Under saturation every answer waits for the 63 before it: p99 there is mostly the
        # queue. At a steady load below every system's capacity it is what a check adds.
        print(f"\nLatency at a steady load ({args.connections} connections, each waiting {args.pause_ms} ms on "
              f"average after an answer; {args.steady_rounds} rounds of {args.seconds} s)\n")
        print(f"gRPC: {args.connections // args.steady_streams} connections, {args.steady_streams} calls in "
              f"flight on each, as Envoy shares its connections.\n")
        print("| system | protocol | requests/s | p50 | p99 |")
        print("| --- | --- | ---: | ---: | ---: |")
        rows = [(s.http_name, "HTTP", s.steady_rounds) for s in systems if s.steady]
        rows += [(s.name, "gRPC", s.grpc_steady_rounds) for s in grpc]
        for name, protocol, rounds in rows:
            rate, p50, p99 = (median(r[i] for r in rounds) for i in range(3))
            print(f"| {name} | {protocol} | {rate:,.0f} | {p50:.0f} µs | {p99:.0f} µs |")


def median(values):
    return statistics.median(list(values))


def ratio(rounds, base, fmt):
    """The median over rounds of a system's rate over `base`'s in the same round, with the
    range: systems run one after another within a round, so a ratio within a round cancels
    most of the drift of this shared machine between rounds."""
    ratios = sorted(r[0] / b[0] for r, b in zip(rounds, base))
    if len(ratios) < 3:
        return fmt.format(statistics.median(ratios))
    return f"{fmt.format(statistics.median(ratios))} ({fmt.format(ratios[0])}-{fmt.format(ratios[-1])})"

if __name__ == "__main__":
    main()
