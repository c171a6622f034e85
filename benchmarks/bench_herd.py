"""The herd (issue 35): N client processes cold-start on K real kernels at once,
against one Redis, one Redis Cluster (3 masters, made by ``redis-cli --cluster
create``) and one SeaweedFS (S3), ranks grouped ``--per-host`` to a simulated host.

Each client is its own Python process (``tests/_herd.py``): it opens the tier
``file://<its host's directory>,<server>`` (the deployment docs/cache.md recommends:
a local level per host in front of the fleet's), says it is ready and blocks; the
harness lets every client go at once (the common start, after imports) and each
compiles the K kernels in the same order (``--order shuffled``: each its own), real
NVRTC compiles. Recorded per server and N:

- **compiles**: real NVRTC compiles in the whole herd; must be K (K + 1 with
  ``--kill``: the killed holder's and its replacement's);
- **wrong bytes**: (client, kernel) pairs whose cubin differs from a lone client's;
- **time to all K** per client from the common start: p50, p99, max, and p99 over
  one lone client's time to compile all K cold through the same server (measured
  first, on a fresh prefix; it also shows the server its scripts);
- **requests per client per kernel** and **per host per kernel**: every request the
  clients sent until they had all K, counted in each client (every command through
  both Redis clients; every obstore call), a connection's one-time set-up
  (``HELLO``, ``CLIENT SETINFO``, ``CLUSTER SLOTS``, ``COMMAND``) and the fleet
  counters a handle sends every 10 s (``HINCRBY``, an S3 ``stats/`` object) apart
  and shown beside; for Redis
  also the servers' ``INFO commandstats`` before and after (script-internal calls
  included there), and the servers' CPU time per request (``/proc/<pid>/stat``);
- **client CPU** (``getrusage`` in each client): the start (interpreter, imports,
  opening the cache: before the common start) and each kernel's ``compile()``, by
  the client's role in it (holder, fleet waiter, host-lock waiter; a client's first
  kernel apart: it also pays the compile path's first use); ``--profile DIR``
  writes a cProfile of each;
- with ``--kill``: the holder of one kernel is SIGKILLed 0.3 s into its compile
  (the compile hangs until killed); the time from the kill to the replacement's
  compile start, against ``lock_lease + 1 s``.

Run (the machine's 24 GiB hold 200 clients; each is a Python process of ~60 MB)::

    python benchmarks/bench_herd.py                          # 200 clients, 8 kernels, 8 per host
    python benchmarks/bench_herd.py --clients 25,50,100,200 --per-host 1   # the scale sweep
    python benchmarks/bench_herd.py --kill --lease 5 --clients 50          # a holder killed
    python benchmarks/bench_herd.py --servers redis --quick  # 24 clients, 4 kernels
    python benchmarks/bench_herd.py --capacity               # each server's request rate
    python benchmarks/bench_herd.py --suite --json ...       # docs/scaling.md's runs

Each herd run is preceded by its lone client (the machine's load, shared with other
jobs, moves between minutes). ``make bench-herd`` runs ``--suite``. Not part of
``make test`` (minutes, hundreds of processes); the same paths at CI scale are
``tests/test_storage_herd.py``. docs/scaling.md has the numbers and the model to
1,000-100,000 ranks.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # the herd's client and the servers

import _herd  # noqa: E402
import _results  # noqa: E402

#: ``--keep``: a run that compiled more than K leaves its clients' logs behind.
KEEP = False
#: ``--timeout``: the clients' request timeout (the URLs' ``timeout``). 200 ranks, the
#: servers and other jobs share 2 cores here: a request can wait longer than the
#: default 0.5 s for a core, and a lease request that times out compiles unlocked
#: (fail-open, as designed) -- a measure of this machine, not of the herd.
TIMEOUT_S = 2.0
#: ``--profile DIR``: each client writes a cProfile of its herd phase there.
PROFILE: str | None = None

# -- servers ---------------------------------------------------------------------------


class Servers:
    """The servers of a run, started on loopback ports and stopped after."""

    def __init__(self, work: Path, which: list[str]) -> None:
        from _redis import RedisCluster, RedisServer

        self.urls: dict[str, str] = {}
        self.pids: dict[str, list[int]] = {}
        self.nodes: dict[str, list[Any]] = {}
        self.ports: dict[str, list[int]] = {}
        self.env = dict(os.environ)
        self.weed: Any = None
        self._stops: list[Any] = []
        try:
            if "redis" in which:
                server = RedisServer(work / "redis", "--maxclients", "10000")
                self._stops.append(server.stop)
                self.urls["redis"] = server.url
                self.pids["redis"] = [server.proc.pid]  # type: ignore[union-attr]
                self.nodes["redis"] = [server.client()]
                self.ports["redis"] = [server.port]
            if "cluster" in which:
                # Redis's default node timeout: at 200 clients on 2 cores a node's
                # heartbeats can be late past the tests' 500 ms (then: CLUSTERDOWN).
                cluster = RedisCluster(work / "cluster", via_cli=True, node_timeout_ms=15000)
                self._stops.append(cluster.stop)
                for s in cluster.servers:
                    s.client().config_set("maxclients", 10000)
                self.urls["cluster"] = cluster.url
                self.pids["cluster"] = [s.proc.pid for s in cluster.servers]  # type: ignore[union-attr]
                self.nodes["cluster"] = [s.client() for s in cluster.servers]
                self.ports["cluster"] = [s.port for s in cluster.servers]
            if "s3" in which:
                from _s3 import SeaweedServer

                weed = SeaweedServer(work / "s3")
                self._stops.append(weed.stop)
                weed.create_bucket("cuforge-test")
                self.weed = weed
                self.pids["s3"] = [weed.proc.pid]  # type: ignore[union-attr]
                self.env = weed.client_env()
        except BaseException:
            self.stop()
            raise

    def url(self, server: str, prefix: str, lease: float) -> str:
        """The server's cache URL under a fresh ``prefix``, with the lease and the
        request ``TIMEOUT_S`` given."""
        if server == "s3":
            return str(
                self.weed.url(prefix=prefix, lock_lease=f"{lease:g}s", timeout=f"{TIMEOUT_S:g}s")
            )
        return f"{self.urls[server]}?prefix={prefix}:&lock_lease={lease:g}s&timeout={TIMEOUT_S:g}s"

    def commands(self, server: str) -> dict[str, int]:
        """Commands each Redis node served so far, summed (``INFO commandstats``)."""
        total: dict[str, int] = {}
        for node in self.nodes.get(server, []):
            for name, row in node.info("commandstats").items():
                cmd = name.removeprefix("cmdstat_")
                total[cmd] = total.get(cmd, 0) + int(row["calls"])
        return total

    def cpu_s(self, server: str) -> float:
        """CPU seconds the server's processes used so far."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in self.pids[server]:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        return total

    def stop(self) -> None:
        for stop in reversed(self._stops):
            stop()


# -- one run ---------------------------------------------------------------------------
def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    out = {k: v - before.get(k, 0) for k, v in after.items()}
    out.pop("info", None)  # the harness's own
    return {k: v for k, v in sorted(out.items()) if v}


def _sum(counts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for k, v in one.items():
            total[k] = total.get(k, 0) + v
    return dict(sorted(total.items()))


def _pct(values: list[float], p: float) -> float:
    """The nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * p / 100) - 1))]


def _by_role(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """CPU ms a client spent in one kernel's ``compile()``, by its role in that kernel
    (``tests/_herd.py``: holder, fleet waiter, host-lock waiter; a client's first
    kernel apart, ``first-<role>``: it also pays the compile path's first use, as a
    lone client does): how many such (client, kernel) pairs, their median, p90 and
    mean."""
    per: dict[str, list[float]] = {}
    for r in results:
        first = True
        for k, role in r["roles"].items():  # in the client's order
            name = f"first-{role}" if first else role
            per.setdefault(name, []).append(1000 * r["cpu_kernel_s"][k])
            first = False
    return {
        role: {"n": len(v), "median": statistics.median(v), "p90": _pct(v, 90),
               "mean": statistics.fmean(v)}
        for role, v in sorted(per.items())
    }  # fmt: skip


def _fleet_ranks(results: list[dict[str, Any]]) -> dict[str, float]:
    """How many of a host's ranks waited on the fleet for some kernel (each opened the
    fleet's level and connected: a cost paid once per rank), mean and max over hosts."""
    ranks: dict[int, int] = {}
    for r in results:
        ranks.setdefault(r["host"], 0)
        if any(role == "fleet" for role in r["roles"].values()):
            ranks[r["host"]] += 1
    counts = list(ranks.values())
    return {"mean": statistics.fmean(counts), "max": max(counts)}


def _had(results: list[dict[str, Any]], t_go: float) -> list[dict[str, float]]:
    """For each kernel (in order): when clients had it, from the common start -- when
    their compile() of it began (median) and returned (median, max)."""
    out = []
    for k in sorted({int(k) for r in results for k in r["wall_kernel"]}):
        began = [r["wall_kernel"][str(k)][0] - t_go for r in results]
        ended = [r["wall_kernel"][str(k)][1] - t_go for r in results]
        out.append(
            {
                "kernel": k,
                "began_median": round(statistics.median(began), 3),
                "median": round(statistics.median(ended), 3),
                "max": round(max(ended), 3),
            }
        )
    return out


def run_herd(
    servers: Servers, server: str, clients: int, per_host: int, kernels: int, unroll: int,
    lease: float, order: str, kill: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """One cold start of ``clients`` processes; the measurements (module docstring)."""
    work = Path(tempfile.mkdtemp(prefix=f"herd-{server}-"))
    url = servers.url(server, f"h{os.getpid()}-{time.monotonic_ns()}", lease)
    marks: dict[str, tuple[dict[str, int], float]] = {}

    def mark(when: str) -> None:
        marks[when] = (servers.commands(server), servers.cpu_s(server))

    try:
        got = _herd.run(
            work, lambda host: f"file://{work}/host{host},{url}", clients, per_host, kernels,
            unroll, s3=server == "s3", env=servers.env, order=order,
            victim=kernels // 2 if kill else None, timeout=1800, mark=mark, profile=PROFILE,
        )  # fmt: skip
        kept = len(got.compiles) != kernels + (1 if kill else 0) and KEEP
    finally:
        if not KEEP:
            shutil.rmtree(work, ignore_errors=True)
    if kept:
        print(f"         (the clients' logs are in {work})", flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
    done = got.finished()
    hosts = -(-clients // per_host)
    times = sorted(r["done"] - got.t_go for r in got.results)
    out: dict[str, Any] = {
        "server": server, "clients": clients, "per_host": per_host, "hosts": hosts,
        "kernels": kernels, "unroll": unroll, "order": order, "lease_s": lease,
        "timeout_s": TIMEOUT_S,
        "compiles": len(got.compiles), "wall_s": got.t_all - got.t_go,
        "compile_s_median": statistics.median(c[3] - c[2] for c in done),  # type: ignore[operator]
        "compile_timeline": sorted(
            (c[1], round(c[2] - got.t_go, 3), round(c[3] - got.t_go, 3)) for c in done  # type: ignore[operator]
        ),
        "client_cpu_ms_per_kernel": 1000 * statistics.median(r["cpu_s"] for r in got.results)
        / kernels,
        "client_cpu_start_ms": 1000 * statistics.median(r["cpu_start_s"] for r in got.results),
        "kernel_had_s": _had(got.results, got.t_go),
        "fleet_ranks_per_host": _fleet_ranks(got.results),
        "client_cpu_ms_by_role": _by_role(got.results),
        "times_s": [round(t, 4) for t in times],
        "p50_s": _pct(times, 50), "p99_s": _pct(times, 99), "max_s": times[-1],
        "_shas": [r["shas"] for r in got.results],
    }  # fmt: skip
    if kill:
        victim = kernels // 2
        t_new = min(c[2] for c in done if c[1] == victim)
        out["takeover_s"] = t_new - (got.t_kill or 0.0)
        out["takeover_limit_s"] = lease + 1.0
    out["requests"] = _sum(r["sent"] for r in got.results)
    work_reqs = got.requests()
    out["counter_requests"] = sum(_herd.counter_requests(r["sent"]) for r in got.results)
    out["setup_requests"] = sum(out["requests"].values()) - work_reqs - out["counter_requests"]
    out["per_client_kernel"] = work_reqs / (len(got.results) * kernels)
    out["per_host_kernel"] = work_reqs / (hosts * kernels)
    per_client = [_herd.work_requests(r["sent"]) / kernels for r in got.results]
    out["per_client_kernel_max"] = max(per_client)
    if server != "s3":  # script-internal calls included
        out["commandstats"] = _delta(marks["all"][0], marks["go"][0])
    cpu = marks["all"][1] - marks["go"][1]
    out["server_cpu_s"] = cpu
    total = sum(out["requests"].values())
    out["server_us_per_request"] = 1e6 * cpu / total if total else None
    return out


def lone(servers: Servers, server: str, kernels: int, unroll: int, lease: float) -> dict[str, Any]:
    """One client alone, cold, on a fresh prefix: its time and the reference bytes."""
    got = run_herd(servers, server, 1, 1, kernels, unroll, lease, "same")
    return {
        "time_s": got["p50_s"], "shas": got["_shas"][0], "compiles": got["compiles"],
        "per_kernel": got["per_client_kernel"], "timeline": got["compile_timeline"],
    }  # fmt: skip


def check(got: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """Wrong bytes against the lone client's, and the p99 ratio."""
    shas = got.pop("_shas")
    got["wrong_bytes"] = sum(
        1 for client_shas in shas for k, sha in client_shas.items() if ref["shas"][k] != sha
    )
    got["lone_s"] = ref["time_s"]
    got["lone_timeline"] = ref["timeline"]
    got["p99_over_lone"] = got["p99_s"] / ref["time_s"]
    return got


def print_row(r: dict[str, Any]) -> None:
    kill = ""
    if "takeover_s" in r:
        kill = f"  takeover {r['takeover_s']:.2f} s (lease + 1 s = {r['takeover_limit_s']:g} s)"
    print(
        f"{r['server']:8} N={r['clients']:4} hosts={r['hosts']:4} K={r['kernels']} "
        f"compiles={r['compiles']:3} wrong={r['wrong_bytes']}  p50 {r['p50_s']:6.2f} s  "
        f"p99 {r['p99_s']:6.2f} s  lone {r['lone_s']:5.2f} s  p99/lone {r['p99_over_lone']:.2f}  "
        f"req/client/kernel {r['per_client_kernel']:.2f} (max {r['per_client_kernel_max']:.2f})  "
        f"req/host/kernel {r['per_host_kernel']:.2f}  setup {r['setup_requests']}  "
        f"counters {r['counter_requests']}  "
        f"server {r['server_us_per_request'] or 0:.1f} us/req  "
        f"client cpu {r['client_cpu_ms_per_kernel']:.1f} ms/kernel{kill}",
        flush=True,
    )
    roles = "  ".join(
        f"{role} {v['median']:.2f} (p90 {v['p90']:.2f}, n={v['n']})"
        for role, v in r["client_cpu_ms_by_role"].items()
    )
    fleet = r["fleet_ranks_per_host"]
    print(f"         client cpu ms per kernel by role, median: {roles}; "
          f"start {r['client_cpu_start_ms']:.0f} ms; ranks of a host that waited on the "
          f"fleet: {fleet['mean']:.1f} (max {fleet['max']})", flush=True)  # fmt: skip
    print(f"         requests: {r['requests']}", flush=True)
    if "commandstats" in r:
        print(f"         commandstats: {r['commandstats']}", flush=True)
    print(f"         compiles (kernel, start, end): {r['compile_timeline']}", flush=True)
    had = ", ".join(f"{h['kernel']}: {h['median']:.2f}/{h['max']:.2f}" for h in r["kernel_had_s"])
    print(f"         clients had kernel k at (median/max s): {had}", flush=True)


# -- capacity --------------------------------------------------------------------------
def _redis_rate(port: int, command: list[str], clients: int) -> float:
    """Requests per second ``redis-benchmark`` gets for ``command`` (100,000 of them)."""
    bench = shutil.which("redis-benchmark") or "/usr/bin/redis-benchmark"
    args = [bench, "-p", str(port), "-n", "100000", "-c", str(clients), "--csv"]
    got = subprocess.run([*args, *command], capture_output=True, text=True, timeout=600)
    row = [line for line in got.stdout.splitlines() if line and not line.startswith('"test"')]
    if not row:
        raise RuntimeError(f"redis-benchmark {' '.join(command)}: {got.stderr or got.stdout}")
    return float(row[-1].split('","')[1].strip('"'))


def capacity(servers: Servers, value_kib: int = 40) -> dict[str, Any]:
    """Requests per second each server answers on this machine (the load generator on
    the same 2 cores), for the requests a herd sends: a waiter's take of a held lease,
    a read of an entry of ``value_kib`` KiB; and the server's CPU per request. For a
    cluster, the node that owns the kernel's slot (a kernel's requests all go there;
    the cluster serves n such nodes' worth of kernels at once)."""
    import redis

    out: dict[str, Any] = {}
    tag = "{" + "ab" * 32 + "}"
    for server in ("redis", "cluster"):
        if server not in servers.urls:
            continue
        ports = servers.ports[server]
        cluster = server == "cluster"
        # A held lease and an entry, as a waiter finds them mid-fill.
        client: Any = (
            redis.cluster.RedisCluster(host="127.0.0.1", port=ports[0]) if cluster
            else redis.Redis(host="127.0.0.1", port=ports[0])
        )  # fmt: skip
        entry, lock = f"cap:{tag}", f"cap:{tag}:lock"
        client.set(entry, os.urandom(value_kib * 1024))
        client.set(lock, "holder", px=600_000)
        # A cluster serves one kernel's keys from one node (their slot's): measure it.
        port = client.get_node_from_key(entry).port if cluster else ports[0]
        from cuforge.storage.redis._store import _SHA, _TAKE

        sha = client.script_load(_TAKE) if not cluster else None
        if cluster:
            for node in servers.nodes[server]:
                sha = node.script_load(_TAKE)
        assert sha == _SHA[_TAKE]
        row: dict[str, Any] = {}
        for name, cmd in (
            ("take_busy", ["EVALSHA", sha, "2", f"cap:{tag}:none", lock, "tok", "30000", "0", "1"]),
            (f"get_{value_kib}k", ["GET", entry]),
        ):
            cpu0 = servers.cpu_s(server)
            rate = _redis_rate(port, cmd, 50)
            row[name + "_per_s"] = rate
            row[name + "_server_us"] = 1e6 * (servers.cpu_s(server) - cpu0) / 100_000
        out[server] = row
    if servers.weed is not None:
        out["s3"] = _s3_rate(servers, value_kib)
    return out


def _s3_rate(
    servers: Servers, value_kib: int, threads: int = 32, seconds: float = 10.0
) -> dict[str, Any]:
    """GETs of one entry-sized object and of a missing one from ``threads`` threads."""
    import obstore

    store = servers.weed.raw("cuforge-test")
    obstore.put(store, "cap/entry", os.urandom(value_kib * 1024))
    row: dict[str, Any] = {}
    for name, path in ((f"get_{value_kib}k", "cap/entry"), ("get_missing", "cap/none")):
        stop = time.monotonic() + seconds
        cpu0 = servers.cpu_s("s3")

        def loop(path: str = path, stop: float = stop) -> int:
            n = 0
            while time.monotonic() < stop:
                with contextlib.suppress(FileNotFoundError):
                    obstore.get(store, path).bytes()
                n += 1
            return n

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            done = sum(pool.map(lambda _: loop(), range(threads)))
        row[name + "_per_s"] = done / seconds
        row[name + "_server_us"] = 1e6 * (servers.cpu_s("s3") - cpu0) / done
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--clients", default="200", help="client counts, comma-separated (200)")
    ap.add_argument("--per-host", type=int, default=8, help="ranks per simulated host (8)")
    ap.add_argument("--kernels", type=int, default=8, help="distinct kernels K (8)")
    ap.add_argument("--unroll", type=int, default=16, help="kernel size (16: ~0.3 s here)")
    ap.add_argument("--servers", default="redis,cluster,s3", help="redis,cluster,s3")
    ap.add_argument("--lease", type=float, default=30.0, help="lock_lease seconds (30)")
    ap.add_argument("--order", choices=("same", "shuffled"), default="same")
    ap.add_argument("--kill", action="store_true", help="SIGKILL one kernel's holder")
    ap.add_argument(
        "--suite", action="store_true",
        help="the runs of docs/scaling.md: 25,50,100,200 clients 1 per host; 200 8 per "
        "host; 50 8 per host with a holder killed (lease 5 s)",
    )  # fmt: skip
    ap.add_argument("--capacity", action="store_true", help="measure each server's capacity")
    ap.add_argument("--quick", action="store_true", help="24 clients, 4 kernels")
    ap.add_argument("--keep", action="store_true", help="keep the logs of a run gone wrong")
    ap.add_argument("--timeout", type=float, default=2.0, help="request timeout (2 s)")
    ap.add_argument(
        "--profile", metavar="DIR",
        help="each herd client writes a cProfile (CPU time) of each kernel's compile() "
        "to DIR/<role>.<client>.<kernel> (role: holder, fleet, host; first-<role> for "
        "a client's first kernel); the last run's. Sum them: python -m pstats",
    )  # fmt: skip
    _results.add_arguments(ap)
    args = ap.parse_args(argv)
    global KEEP, TIMEOUT_S, PROFILE
    KEEP, TIMEOUT_S = args.keep, args.timeout
    if args.profile:
        PROFILE = os.path.abspath(args.profile)
        os.makedirs(PROFILE, exist_ok=True)
    # A SIGTERM unwinds like an exception: the clients and the servers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    kernels = 4 if args.quick else args.kernels
    counts = [24] if args.quick else [int(n) for n in args.clients.split(",")]
    plans = [(n, args.per_host, args.kill, args.lease) for n in counts]
    if args.suite:
        plans = [(n, 1, False, args.lease) for n in (25, 50, 100, 200)]
        plans += [(200, 8, False, args.lease), (50, 8, True, 5.0)]
    which = args.servers.split(",")
    # Each client is a fresh interpreter: with PYTHONDONTWRITEBYTECODE set (or a tree
    # just edited), every one would compile cuforge's changed modules from source --
    # tens of ms each, on every one of hundreds of ranks. A deployed cuforge has its
    # bytecode (pip writes it at install); so has this run -- and so have the modules a
    # compile imports (cuda.bindings, cuda.pathfinder), which an environment installed
    # without bytecode (the GPU machine's) would otherwise compile from source in every
    # kernel's holder, at its first compile.
    import compileall
    import importlib.util

    import cuforge

    compileall.compile_dir(os.path.dirname(cuforge.__file__), quiet=1)
    for name in ("cuda.bindings", "cuda.pathfinder"):
        spec = importlib.util.find_spec(name)
        for where in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(where, quiet=1)
    work = Path(tempfile.mkdtemp(prefix="herd-servers-"))
    servers = Servers(work, which)
    rows: list[dict[str, Any]] = []
    try:
        if args.capacity:
            cap = capacity(servers)
            print(json.dumps(cap, indent=1))
            _results.write(args.json, "bench_herd", {"capacity": cap}, args.note)
            return 0
        shas: dict[str, Any] = {}
        # One untimed lone client first: the first process on a machine reads NVRTC and
        # the Python modules from disk (on a 16-core host: 2.3 s against 0.45 s for the
        # next lone client), which no later lone client or rank pays again.
        lone(servers, which[0], kernels, args.unroll, plans[0][3])
        for server in which:
            for n, per_host, kill, lease in plans:
                # The lone client runs right before its herd: the same machine load.
                ref = lone(servers, server, kernels, args.unroll, lease)
                if shas.setdefault(server, ref["shas"]) != ref["shas"]:
                    raise RuntimeError(f"{server}: two lone compiles made different bytes")
                print(f"{server}: lone client, {kernels} kernels cold: {ref['time_s']:.2f} s "
                      f"({ref['compiles']} compiles, {ref['per_kernel']:.2f} requests a "
                      "kernel)", flush=True)  # fmt: skip
                got = run_herd(servers, server, n, per_host, kernels, args.unroll, lease,
                               args.order, kill=kill)  # fmt: skip
                rows.append(check(got, ref))
                print_row(rows[-1])
    finally:
        servers.stop()
        shutil.rmtree(work, ignore_errors=True)
    _results.write(args.json, "bench_herd", {"runs": rows}, args.note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
