#!/usr/bin/env python3
"""What Redis spends per check, by algorithm, side by side with the floors, in one run.

A system may also name a pattern other than the admitted check of one tier (see the
`redis_cost` example): `gcra:denied`, `module_sub_windows:tiers8`,
`module_concurrency:slots1000`, `token_bucket:reported` (a report of metered work in place of
each check), `gcra:reserved` (a reservation and its commit in place of each check), beside
`floor_8k`, the floor writing as much as 1,000 words.

For each system (every algorithm by the Lua functions and, as `module_<algorithm>`, by
tollgate's Redis module, built here in release; two rules in one call; and the floors: a script of TIME,
GET and SET PX deciding nothing, for one key and for two, and `return 1`; and the peer that
decides inside Redis, redis-cell's CL.THROTTLE (GCRA), its module built from crates.io), the load of the `redis_cost` example
(16 callers on one pipelined connection, keys cycling over 10,000, every check admitted)
against a redis-server of this script's own, twice, each time after a first pass over the same
keys, so that every check measured finds its key held, as the floor's GET does:

- under callgrind: user-space instructions of redis-server per check (the first pass, the
  counters zeroed, the checks, the counters dumped), which repeat to within about 1-2%
  whatever else the machine is doing;
- natively: Redis's CPU (user + system, `INFO cpu`) per check, and `INFO commandstats`'s
  usec_per_call of the FCALL (or EVALSHA), which includes the commands it runs.

Usage: benches/redis/cost.py [--checks 20000] [--callgrind-checks 4000] [--systems a,b,...]
[--example PATH (another build of the load, to compare)] [--instructions-only]
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benches", "service"))
from bench import free_port, wait_port  # noqa: E402
SYSTEMS = ["fixed_window", "sliding_window", "sub_windows", "sliding_log", "token_bucket",
           "interval_bucket", "leaky_bucket", "gcra", "warm_up", "hit_counter", "concurrency",
           "two_rules", "floor", "floor_two", "one", "redis_cell"]
# tollgate's Redis module (crates/tollgate-redis-module) runs every algorithm but the sliding log.
SYSTEMS += ["module_" + s for s in SYSTEMS[:12] if s != "sliding_log"]
CELL = "0.2.2"


def redis_argv(port, workdir, module=None):
    argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
            "--appendonly", "no", "--dir", workdir]
    return argv + (["--loadmodule", module] if module else [])


def redis_cell(workdir):
    """redis-cell's module, built from its crates.io source (seconds): a project that depends
    on it fetches the source, which is then built on its own."""
    project = os.path.join(workdir, "cell-fetch")
    os.makedirs(os.path.join(project, "src"))
    with open(os.path.join(project, "Cargo.toml"), "w") as f:
        f.write('[package]\nname = "cell-fetch"\nversion = "0.0.0"\nedition = "2021"\n'
                f'[dependencies]\nredis-cell = "={CELL}"\n')
    open(os.path.join(project, "src", "lib.rs"), "w").close()
    subprocess.run(["cargo", "fetch", "-q"], cwd=project, check=True)
    home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    source = glob.glob(os.path.join(home, "registry", "src", "*", f"redis-cell-{CELL}"))[0]
    copy = os.path.join(workdir, "redis-cell")
    shutil.copytree(source, copy)
    target = os.path.join(workdir, "cell-target")
    subprocess.run(["cargo", "build", "--release", "-q", "--target-dir", target], cwd=copy,
                   check=True, stderr=subprocess.DEVNULL)
    return os.path.join(target, "release", "libredis_cell.so")


def tollgate_module():
    """tollgate's Redis module, built in release."""
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "tollgate-redis-module"],
                   cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "release", "libtollgate_redis_module.so")


def cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                          text=True, check=True).stdout


def load(example, port, system, checks):
    subprocess.run([example, f"redis://127.0.0.1:{port}/", system, str(checks)],
                   check=True, stdout=subprocess.DEVNULL)


def instructions(example, system, checks, workdir, module=None):
    """redis-server's instructions per check under callgrind."""
    port = free_port()
    out = os.path.join(workdir, f"callgrind.{system}")
    server = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p"]
                              + redis_argv(port, workdir, module),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, timeout=120)
        # The same keys as the measured checks: each of them then checks a key held.
        load(example, port, system, checks)
        subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True,
                       check=True)
        load(example, port, system, checks)
        subprocess.run(["callgrind_control", "-d", str(server.pid)], capture_output=True,
                       check=True)
        time.sleep(0.5)
        dump = max(glob.glob(f"{out}.{server.pid}.*"), key=os.path.getmtime)
        total = int(re.search(r"^(?:summary|totals): (\d+)", open(dump).read(), re.M).group(1))
        return total / checks
    finally:
        server.terminate()
        server.wait(60)


def native(example, system, checks, workdir, module=None):
    """Redis's CPU per check (µs) and the call's usec_per_call, run natively."""
    port = free_port()
    server = subprocess.Popen(redis_argv(port, workdir, module), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        load(example, port, system, checks)
        cli(port, "config", "resetstat")
        before = cpu(port)
        load(example, port, system, checks)
        used = cpu(port) - before
        stats = cli(port, "info", "commandstats")
        call = re.search(r"^cmdstat_(?:fcall|evalsha|cl\.throttle|tollgate\.check|tollgate\.batch|tollgate\.settle):calls=(\d+),usec=(\d+),"
                         r"usec_per_call=([\d.]+)", stats, re.M)
        return used * 1e6 / checks, float(call.group(3))
    finally:
        server.terminate()
        server.wait(30)


def cpu(port):
    info = cli(port, "info", "cpu")
    user = float(re.search(r"^used_cpu_user:([\d.]+)", info, re.M).group(1))
    system = float(re.search(r"^used_cpu_sys:([\d.]+)", info, re.M).group(1))
    return user + system


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checks", type=int, default=20_000)
    parser.add_argument("--callgrind-checks", type=int, default=4_000)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--example")
    parser.add_argument("--instructions-only", action="store_true")
    args = parser.parse_args()
    example = args.example
    if example is None:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "tollgate", "--features",
                        "redis", "--example", "redis_cost"], cwd=ROOT, check=True)
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
        example = os.path.join(target, "release", "examples", "redis_cost")
    version = subprocess.run(["redis-server", "--version"], capture_output=True,
                             text=True).stdout.split()[2]
    print(f"redis-server {version}; {args.checks} checks natively, "
          f"{args.callgrind_checks} under callgrind, 16 callers, one connection\n")
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        ours = None
        for system in args.systems.split(","):
            module = None
            if system == "redis_cell":
                module = redis_cell(workdir)
            elif system.startswith("module_"):
                ours = ours or tollgate_module()
                module = ours
            per_check = instructions(example, system, args.callgrind_checks, workdir, module)
            cpu_us, usec = (0.0, 0.0) if args.instructions_only else native(
                example, system, args.checks, workdir, module)
            rows.append((system, per_check, cpu_us, usec))
    floor = next((r[1] for r in rows if r[0] == "floor"), None)
    print("| system | instructions/check | vs floor | Redis CPU/check | usec_per_call |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for system, per_check, cpu_us, usec in rows:
        ratio = f"{per_check / floor:.2f}x" if floor else "–"
        print(f"| {system} | {per_check:,.0f} | {ratio} | {cpu_us:.1f} µs | {usec:.2f} µs |")


if __name__ == "__main__":
    main()
