#!/usr/bin/env python3
"""User-space instructions per request of each system of the service benchmark, counted by
callgrind: unlike requests per second, the count repeats to within about 1% whatever else
this shared machine is doing, so it shows what a change to a request's path saves.

Each server runs under `valgrind --tool=callgrind`; wrk (16 connections) warms it up, its
counters are zeroed, wrk runs for a few seconds more, the counters are dumped and divided by
the requests wrk completed. gRPC the same way, with rls_load (16 connections, one call in
flight on each) in place of wrk. Kernel time (the larger part of a request on loopback) is not
counted. Usage (see `instructions`): instructions.py --throttlecrab PATH [--seconds 3]
[--grpc-only] [--tollgate PATH (another build of tollgate, to compare)]

One gRPC row exports traces (`TRACING_ENABLED`, 1% sampled) over OTLP/HTTP to a sink of this
script's own that takes every batch and answers 200.
"""
import argparse
import contextlib
import glob
import http.server
import os
import re
import subprocess
import tempfile
import threading
import time

import bench


@contextlib.contextmanager
def under_callgrind(argv, workdir, env, *ports):
    """The server `argv` run under callgrind, once it listens on every one of `ports`."""
    out = os.path.join(workdir, "callgrind")
    server = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p"] + argv,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        for port in ports:
            bench.wait_port(port, timeout=120)
        yield server, out
    finally:
        server.terminate()
        server.wait(30)


def per_request(server, out, load):
    """Instructions per request of `server` under `load(seconds)`, which returns the requests
    it completed: a second's warm-up, the counters zeroed, the load, the counters dumped."""
    load(1)
    subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True, check=True)
    requests = load(None)
    subprocess.run(["callgrind_control", "-d", str(server.pid)], capture_output=True, check=True)
    time.sleep(0.5)
    dump = max(glob.glob(f"{out}.{server.pid}.*"), key=os.path.getmtime)
    total = int(re.search(r"^(?:summary|totals): (\d+)", open(dump).read(), re.M).group(1))
    return total / requests


def count(argv, port, paths, seconds, workdir, env=None):
    """Instructions per request of the server `argv` for each (name, path, body) in `paths`."""
    with under_callgrind(argv, workdir, env, port) as (server, out):
        results = []
        for name, path, body in paths:
            script = os.path.join(workdir, f"{port}.lua")
            with open(script, "w") as f:
                f.write(f"BODY = [[{body}]]\nPATH = [[{path}]]\n" + bench.WRK_SCRIPT)

            def load(warm, name=name, script=script):
                wrk = ["wrk", "-t1", "-c16", "-s", script, f"http://127.0.0.1:{port}", f"-d{warm or seconds}s"]
                text = subprocess.run(wrk, capture_output=True, text=True, check=True).stdout
                if "Non-2xx" in text:
                    raise SystemExit(f"{name}: answers that were not 2xx:\n{text}")
                return int(re.search(r"(\d+) requests in", text).group(1))

            results.append((name, per_request(server, out, load)))
        return results


def count_grpc(argv, port, grpc, name, seconds, workdir, env=None):
    """Instructions per `ShouldRateLimit` call of the server `argv`, whose gRPC listener is
    `grpc` (and HTTP `port`, to know when it is up)."""
    with under_callgrind(argv, workdir, env, port, grpc) as (server, out):
        def load(warm):
            duration = warm or seconds
            text = subprocess.run([bench.RLS_LOAD, f"http://127.0.0.1:{grpc}", "16", str(duration), "10000", "0",
                                   "1"], capture_output=True, text=True, check=True).stdout
            # rls_load prints the rate of all answered calls over the run.
            return float(text.split()[0]) * duration

        return [(name, per_request(server, out, load))]


class Sink(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that reads each batch and answers 200 with an empty answer."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def otlp_sink():
    """A running sink; its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--throttlecrab", required=True)
    parser.add_argument("--grpc-only", action="store_true")
    parser.add_argument("--tollgate", default=bench.TOLLGATE)
    parser.add_argument("--without-traces", action="store_true", help="no row exporting traces (a build without them)")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp()
    redis_port, module_port = bench.free_port(), bench.free_port()
    argv = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir]
    redis = subprocess.Popen(argv + ["--port", str(redis_port)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    # Another, beside it, with tollgate's Redis module, for the rows that use it.
    with_module = subprocess.Popen(argv + ["--port", str(module_port), "--loadmodule", bench.MODULE],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        bench.wait_port(redis_port)
        bench.wait_port(module_port)
        if not args.grpc_only:
            rows += http_rows(args, redis_port, module_port, workdir)
        port, grpc = bench.free_port(), bench.free_port()
        grpc_rows = count_grpc([bench.TRIVIAL, f"127.0.0.1:{port}", f"127.0.0.1:{grpc}"], port, grpc,
                               "ceiling: tonic answering OK", args.seconds, workdir)
        env = dict(os.environ, RUST_LOG="warn")
        sink = otlp_sink()
        traced = dict(env, TRACING_ENABLED="true", TRACING_SAMPLING_RATE="0.01", TRACING_EXPORTER_PROTOCOL="http",
                      OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"http://127.0.0.1:{sink}/v1/traces")
        systems = [(name, store, extra, env)
                   for name, store, extra in bench.tollgate_systems(redis_port, module_port)]
        if not args.without_traces:
            systems.insert(1, ("tollgate, memory store, traces on (1% sampled, OTLP/HTTP)", "{ kind: memory }", [],
                               traced))
        for name, store, extra, environment in systems:
            port, grpc = bench.free_port(), bench.free_port()
            config = os.path.join(workdir, f"{port}.yaml")
            with open(config, "w") as f:
                f.write(bench.RULES.format(port=port, grpc=grpc, store=store))
            envoy = os.path.join(workdir, f"{port}-envoy.yaml")
            with open(envoy, "w") as f:
                f.write(bench.ENVOY)
            grpc_rows += count_grpc([args.tollgate, "serve", "--config", config, envoy] + extra, port, grpc, name,
                                    args.seconds, workdir, environment)
    finally:
        redis.terminate()
        with_module.terminate()
    if rows:
        ceiling, peer = rows[0][1], rows[-1][1]
        print(f"User-space instructions per request (callgrind, wrk at 16 connections, {args.seconds} s)\n")
        print("| system | instructions | vs ceiling | vs peer |")
        print("| --- | ---: | ---: | ---: |")
        for name, n in rows:
            print(f"| {name} | {n:,.0f} | {n / ceiling:.2f}x | {n / peer:.2f}x |")
    print(f"\nUser-space instructions per ShouldRateLimit call (callgrind, rls_load at 16 connections, "
          f"{args.seconds} s)\n")
    print("| system | instructions | vs ceiling |")
    print("| --- | ---: | ---: |")
    for name, n in grpc_rows:
        print(f"| {name} | {n:,.0f} | {n / grpc_rows[0][1]:.2f}x |")


def http_rows(args, redis_port, module_port, workdir):
    """The HTTP rows: the ceilings, tollgate's systems, the peer."""
    rows = []
    port, wrapped = bench.free_port(), bench.free_port()
    rows += count([bench.TRIVIAL, f"127.0.0.1:{port}"], port, [
        ("ceiling: axum answering a constant", "/v1/check", bench.CEILING_BODY),
        ("the ceiling behind a do-nothing tower layer", "/v1/identity", "LAYERED"),
        ("the ceiling behind a layer adding constant rate limit fields", "/v1/fields", "LAYERED"),
        ("the ceiling behind tollgate's tower layer", "/v1/layered", "LAYERED"),
    ], args.seconds, workdir)
    rows += count([bench.TRIVIAL, f"127.0.0.1:{port}", f"127.0.0.1:{bench.free_port()}", f"127.0.0.1:{wrapped}"],
                  wrapped, [("the ceiling's app wrapped in tollgate's layer", "/v1/check", "LAYERED")],
                  args.seconds, workdir)
    bare = bench.free_port()
    rows += count([bench.TRIVIAL, f"127.0.0.1:{port}", f"127.0.0.1:{bench.free_port()}",
                   f"127.0.0.1:{bench.free_port()}", f"127.0.0.1:{bare}"],
                  bare, [("the ceiling's handler without axum's router", "/v1/check", bench.CEILING_BODY)],
                  args.seconds, workdir)
    env = dict(os.environ, RUST_LOG="warn")
    for name, store, extra in bench.tollgate_systems(redis_port, module_port):
        port, grpc = bench.free_port(), bench.free_port()
        config = os.path.join(workdir, f"{port}.yaml")
        with open(config, "w") as f:
            f.write(bench.RULES.format(port=port, grpc=grpc, store=store))
        rows += count([args.tollgate, "serve", "--config", config] + extra, port, [
            (name + ", /v1/check (JSON)", "/v1/check", bench.TOLLGATE_BODY),
            (name + ", /v1/auth (nginx)", "/v1/auth", ""),
        ], args.seconds, workdir, env)
    port = bench.free_port()
    rows += count([args.throttlecrab, "--http", "--http-port", str(port), "--http-host", "127.0.0.1"], port,
                  [("peer: throttlecrab-server (HTTP)", "/throttle", bench.PEER_BODY)], args.seconds, workdir)
    return rows


if __name__ == "__main__":
    main()
