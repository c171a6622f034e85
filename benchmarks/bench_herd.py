"""The herd (issue 35): N client processes cold-start on K real kernels at once,
against one Redis, one Redis Cluster (3 masters, made by ``redis-cli --cluster
create``) and one SeaweedFS (S3), ranks grouped ``--per-host`` to a simulated host.

Each client is its own Python process: it imports cuforge, opens the tier
``file:///<its host's directory>,<server>`` (the deployment cache.md recommends: a
local level per host in front of the fleet's), says it is ready and blocks on a
file lock the harness holds; the harness lets every client go at once (the common
start, after imports) and each client compiles the K kernels in the same order
(``--order shuffled``: each its own order), real NVRTC compiles of templated,
unrolled kernels. Recorded per server:

- **compiles**: real NVRTC compiles in the whole herd (each one appends a line);
  must be K (K + 1 with ``--kill``: the killed holder's and its replacement's);
- **wrong bytes**: (client, kernel) pairs whose cubin differs from a lone client's
  cold compile; must be 0;
- **time to all K ready** per client, from the common start: p50, p99, max, and the
  ratio of p99 to one lone client's time to compile all K cold through the same
  server (measured first, on a fresh prefix);
- **server requests per client per kernel** and **per host per kernel**, from the
  common start until every client has all K (Redis: ``INFO commandstats`` of every
  node before and after; S3: every request each client's obstore calls made,
  counted in the client), with the connections' set-up commands (``HELLO``,
  ``CLIENT SETINFO``, ``CLUSTER SLOTS``, ``COMMAND``) apart, and the server's CPU
  time per request (``/proc/<pid>/stat``);
- with ``--kill``: the holder of one kernel is SIGKILLed in the middle of its compile
  (its compile sleeps until killed); the time from the kill to the replacement's
  compile start, against ``lock_lease + 1 s``.

Run (the machine's 24 GiB hold 200 clients; each is a Python process of ~60 MB)::

    python benchmarks/bench_herd.py                          # 200 clients, 8 kernels, 8 per host
    python benchmarks/bench_herd.py --clients 25,50,100,200 --per-host 1   # the scale sweep
    python benchmarks/bench_herd.py --kill --lease 5         # a holder SIGKILLed mid-compile
    python benchmarks/bench_herd.py --servers redis --quick  # 24 clients, 4 kernels
    python benchmarks/bench_herd.py --capacity               # each server's request capacity

Not part of ``make test`` (minutes, hundreds of processes); the correctness of the
same paths at CI scale is ``tests/test_storage_herd.py``. docs/scaling.md has the
numbers and the model to 1,000-100,000 ranks.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import random
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
sys.path.insert(0, str(HERE.parent / "tests"))  # the servers' helpers

import _results

ARCH = "sm_90"
#: What a connection sends once, before its first request (not per kernel).
SETUP_COMMANDS = ("hello", "client", "cluster", "command", "readonly", "ping", "auth", "select")
S3_CALLS = ("get", "get_range", "put", "head", "delete", "list")


def kernel_source(i: int, unroll: int) -> str:
    """A real kernel whose compile takes ~0.4 s (unroll 16) to ~1 s (32) here."""
    return f"""
template <int N> struct Poly {{
    __device__ static float at(float x) {{ return Poly<N - 1>::at(x) * x + {i + 1}.0f / N; }}
}};
template <> struct Poly<0> {{ __device__ static float at(float) {{ return 1.0f; }} }};
extern "C" __global__ void herd_{i}(float* out, const float* in, int n) {{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    float x = in[t];
    #pragma unroll
    for (int j = 0; j < {unroll}; ++j) x = Poly<24>::at(x) + sinf(x * {i + 2}.0f + j);
    out[t] = x;
}}
"""


# -- the client ------------------------------------------------------------------------
def _block_on(path: str) -> None:
    """Wait (no polling) until the harness lets go of its exclusive lock on ``path``."""
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _count_s3(counts: dict[str, int]) -> None:
    """Count every obstore request this process makes (the S3 backend's only client)."""
    import obstore

    for name in S3_CALLS:
        real = getattr(obstore, name)

        def counted(*a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            counts[_name] = counts.get(_name, 0) + 1
            return _real(*a, **kw)

        setattr(obstore, name, counted)


def _name(command: Any) -> str:
    raw = command[0] if command else b"?"
    name = raw.decode() if isinstance(raw, bytes) else str(raw)
    return name.lower() if " " not in name else name.split()[0].lower()


def _count_redis(counts: dict[str, int]) -> None:
    """Count every command this process sends to Redis (a pipeline of n: n), through
    the small client and through redis-py (patched when the backend imports it)."""
    from cuforge.storage.redis import _resp, _store

    def tally(commands: Any) -> None:
        for command in commands:
            key = _name(command)
            counts[key] = counts.get(key, 0) + 1

    roundtrip = _resp._Conn.roundtrip

    def counted_roundtrip(self: Any, commands: Any) -> Any:
        tally(commands)
        return roundtrip(self, commands)

    _resp._Conn.roundtrip = counted_roundtrip  # type: ignore[method-assign]
    real_import = _store.redis_py

    def redis_py() -> Any:
        module = real_import()
        cls = module.connection.AbstractConnection
        if not getattr(cls, "_herd_counted", False):
            send, pack_many = cls.send_command, cls.pack_commands

            def send_command(self: Any, *args: Any, **kw: Any) -> Any:
                tally([args])
                return send(self, *args, **kw)

            def pack_commands(self: Any, commands: Any) -> Any:
                commands = list(commands)
                tally(commands)
                return pack_many(self, commands)

            cls.send_command, cls.pack_commands = send_command, pack_commands
            cls._herd_counted = True
        return module

    _store.redis_py = redis_py


def client(job: dict[str, Any]) -> None:
    """One rank: open the cache, wait for the start, compile every kernel, report."""
    from cuforge import Program, ProgramOptions
    from cuforge.compile import _nvrtc
    from cuforge.utils import open_cache

    sent: dict[str, int] = {}  # requests this client sent, by command
    if job["s3"]:
        _count_s3(sent)
    else:
        _count_redis(sent)
    real = _nvrtc.compile_cpp
    victim = job.get("victim")

    def counted(source: bytes, *a: Any, **kw: Any) -> Any:
        start = time.monotonic()
        if victim is not None and b"herd_%d(" % victim in source:
            try:  # the first compile of the victim kernel hangs until it is killed
                os.close(os.open(job["victim_mark"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                with open(job["counter"], "a") as f:
                    f.write(f"{os.getpid()} {victim} {start} victim\n")
                while True:
                    time.sleep(60)
            except FileExistsError:
                pass
        out = real(source, *a, **kw)
        kernel = source.split(b"herd_", 1)[1].split(b"(", 1)[0].decode()
        with open(job["counter"], "a") as f:
            f.write(f"{os.getpid()} {kernel} {start} {time.monotonic()}\n")
        return out

    _nvrtc.compile_cpp = counted
    order = list(range(job["kernels"]))
    if job["order"] == "shuffled":
        random.Random(job["i"]).shuffle(order)
    sources = {k: kernel_source(k, job["unroll"]) for k in order}
    cache = open_cache(job["url"])
    opts = ProgramOptions(arch=ARCH)
    Path(job["dir"], f"ready.{job['i']}").touch()
    _block_on(job["go"])
    cpu0 = time.process_time()
    shas = {}
    for k in order:
        obj = Program(sources[k], "c++", options=opts).compile("cubin", cache=cache)
        shas[k] = hashlib.sha256(obj.code).hexdigest()
    done = time.monotonic()
    result = {"i": job["i"], "pid": os.getpid(), "done": done, "shas": shas,
              "cpu_s": time.process_time() - cpu0,
              "sent": dict(sent), "stats": cache.stats().as_dict()}  # fmt: skip
    tmp = Path(job["dir"], f".result.{job['i']}")
    tmp.write_text(json.dumps(result))
    tmp.rename(Path(job["dir"], f"result.{job['i']}"))
    _block_on(job["exit"])
    cache.close()
    Path(job["dir"], f"left.{job['i']}").write_text(json.dumps(dict(sent)))


# -- servers ---------------------------------------------------------------------------
class Servers:
    """The three servers of a run, started on loopback ports and stopped after."""

    def __init__(self, work: Path, which: list[str]) -> None:
        from _redis import RedisCluster, RedisServer

        self.urls: dict[str, str] = {}
        self.pids: dict[str, list[int]] = {}
        self.nodes: dict[str, list[Any]] = {}
        self.env = dict(os.environ)
        self._stops: list[Any] = []
        if "redis" in which:
            server = RedisServer(work / "redis", "--maxclients", "20000")
            self._stops.append(server.stop)
            self.urls["redis"] = server.url
            self.pids["redis"] = [server.proc.pid]  # type: ignore[union-attr]
            self.nodes["redis"] = [server.client()]
        if "cluster" in which:
            cluster = RedisCluster(work / "cluster", via_cli=True)
            self._stops.append(cluster.stop)
            self.urls["cluster"] = cluster.url
            self.pids["cluster"] = [s.proc.pid for s in cluster.servers]  # type: ignore[union-attr]
            self.nodes["cluster"] = [s.client() for s in cluster.servers]
        if "s3" in which:
            from _s3 import SeaweedServer

            weed = SeaweedServer(work / "s3")
            self._stops.append(weed.stop)
            self.urls["s3"] = weed.url(prefix="herd")
            self.pids["s3"] = [weed.proc.pid]  # type: ignore[union-attr]
            self.env = weed.client_env()

    def url(self, server: str, prefix: str, lease: float) -> str:
        """The server's cache URL under a fresh ``prefix``, with the lease given."""
        base = self.urls[server]
        if server == "s3":
            head, _, query = base.partition("?")
            return f"{head.rsplit('/', 1)[0]}/{prefix}?{query}&lock_lease={lease:g}s"
        return f"{base}?prefix={prefix}:&lock_lease={lease:g}s"

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
    return {k: v for k, v in out.items() if v}


def _sum(counts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for k, v in one.items():
            total[k] = total.get(k, 0) + v
    return dict(sorted(total.items()))


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def run_herd(
    servers: Servers, server: str, clients: int, per_host: int, kernels: int, unroll: int,
    lease: float, order: str, kill: bool = False, timeout: float = 900,
) -> dict[str, Any]:  # fmt: skip
    """One cold start of ``clients`` processes; the measurements (module docstring)."""
    work = Path(tempfile.mkdtemp(prefix=f"herd-{server}-"))
    prefix = f"h{os.getpid()}-{time.monotonic_ns()}"
    url = servers.url(server, prefix, lease)
    go, leave = work / "go.lock", work / "exit.lock"
    go_fd = os.open(go, os.O_CREAT | os.O_RDWR, 0o600)
    exit_fd = os.open(leave, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(go_fd, fcntl.LOCK_EX)
    fcntl.flock(exit_fd, fcntl.LOCK_EX)
    counter = work / "compiles"
    counter.touch()
    procs: list[subprocess.Popen[bytes]] = []
    victim = kernels // 2 if kill else None
    try:
        for i in range(clients):
            host = work / f"host{i // per_host}"
            job = {
                "i": i, "url": f"file://{host},{url}", "dir": str(work), "go": str(go),
                "exit": str(leave), "counter": str(counter), "kernels": kernels,
                "unroll": unroll, "order": order, "s3": server == "s3", "victim": victim,
                "victim_mark": str(work / "victim"),
            }  # fmt: skip
            log = open(work / f"log.{i}", "wb")  # noqa: SIM115 - closed with the process
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--client", json.dumps(job)],
                    stdout=log, stderr=subprocess.STDOUT, env=servers.env,
                )  # fmt: skip
            )
        deadline = time.monotonic() + timeout
        while sum(1 for n in os.listdir(work) if n.startswith("ready.")) < clients:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a client failed to start: {_first_log(work, procs)}")
            time.sleep(0.05)
        before, cpu0 = servers.commands(server), servers.cpu_s(server)
        t_go = time.monotonic()
        fcntl.flock(go_fd, fcntl.LOCK_UN)
        t_kill = victim_pid = None
        alive = clients
        while sum(1 for n in os.listdir(work) if n.startswith("result.")) < alive:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the herd did not finish: {_first_log(work, procs)}")
            if kill and t_kill is None:
                for line in counter.read_text().splitlines():
                    if line.endswith("victim"):
                        victim_pid = int(line.split()[0])
                        time.sleep(0.3)  # in the middle of its compile
                        os.kill(victim_pid, signal.SIGKILL)
                        t_kill = time.monotonic()
                        alive -= 1
            dead = [p for p in procs if p.poll() not in (None, -signal.SIGKILL)]
            if dead:
                raise RuntimeError(f"a client failed: {_first_log(work, procs)}")
            time.sleep(0.02)
        t_all = time.monotonic()
        during, cpu1 = servers.commands(server), servers.cpu_s(server)
        fcntl.flock(exit_fd, fcntl.LOCK_UN)
        for p in procs:
            p.wait(timeout=120)
        after = servers.commands(server)
        results = [json.loads((work / n).read_text()) for n in os.listdir(work)
                   if n.startswith("result.")]  # fmt: skip
        exits = [json.loads((work / n).read_text()) for n in os.listdir(work)
                 if n.startswith("left.")]  # fmt: skip
        lines = [line.split() for line in counter.read_text().splitlines()]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        os.close(go_fd)
        os.close(exit_fd)
    compiles = [ln for ln in lines if ln[-1] != "victim"]
    out: dict[str, Any] = {
        "server": server, "clients": clients, "per_host": per_host,
        "hosts": -(-clients // per_host), "kernels": kernels, "order": order,
        "lease_s": lease, "compiles": len(compiles) + (1 if kill else 0),
        "compile_s_median": statistics.median(float(ln[3]) - float(ln[2]) for ln in compiles),
        "wall_s": t_all - t_go,
    }  # fmt: skip
    out["compile_timeline"] = sorted(
        (int(ln[1]), round(float(ln[2]) - t_go, 3), round(float(ln[3]) - t_go, 3))
        for ln in compiles
    )
    out["client_cpu_ms_per_kernel"] = 1000 * statistics.median(r["cpu_s"] for r in results) / kernels
    out["times_s"] = sorted(r["done"] - t_go for r in results)
    out["p50_s"] = _pct(out["times_s"], 50)
    out["p99_s"] = _pct(out["times_s"], 99)
    out["max_s"] = out["times_s"][-1]
    out["_shas"] = [r["shas"] for r in results]
    if kill:
        t_new = min(float(ln[2]) for ln in compiles if int(ln[1]) == victim)
        out["takeover_s"] = t_new - (t_kill or 0)
        out["killed_pid"] = victim_pid
    out["requests"] = _sum(r["sent"] for r in results)  # until all K ready
    out["requests_with_exit"] = _sum(exits)  # and the counters' flush at close
    if server != "s3":
        out["commandstats"] = _delta(during, before)  # script-internal calls included
    setup = sum(v for k, v in out["requests"].items() if k in SETUP_COMMANDS)
    work_reqs = sum(out["requests"].values()) - setup
    out["setup_requests"] = setup
    out["per_client_kernel"] = work_reqs / (clients * kernels)
    out["per_host_kernel"] = work_reqs / (out["hosts"] * kernels)
    out["server_cpu_s"] = cpu1 - cpu0
    total_reqs = sum(out["requests"].values())
    out["server_us_per_request"] = 1e6 * (cpu1 - cpu0) / total_reqs if total_reqs else None
    del after
    shutil.rmtree(work, ignore_errors=True)
    return out


def _first_log(work: Path, procs: list[subprocess.Popen[bytes]]) -> str:
    for i, p in enumerate(procs):
        if p.poll() not in (None, 0, -signal.SIGKILL):
            return f"client {i} exited {p.returncode}:\n" + (work / f"log.{i}").read_text()[-3000:]
    return "(no client log)"


def lone(servers: Servers, server: str, kernels: int, unroll: int, lease: float) -> dict[str, Any]:
    """One client alone, cold, on a fresh prefix: its time and the reference bytes."""
    got = run_herd(servers, server, 1, 1, kernels, unroll, lease, "same")
    return {"time_s": got["p50_s"], "shas": got["_shas"][0], "compiles": got["compiles"]}


def check(got: dict[str, Any], ref: dict[str, Any], lone_s: float) -> dict[str, Any]:
    """Wrong bytes against the lone client's, and the p99 ratio."""
    shas = got.pop("_shas")
    got["wrong_bytes"] = sum(
        1 for client_shas in shas for k, sha in client_shas.items() if ref["shas"][k] != sha
    )
    got["lone_s"] = lone_s
    got["p99_over_lone"] = got["p99_s"] / lone_s
    return got


def print_row(r: dict[str, Any]) -> None:
    kill = f"  takeover {r['takeover_s']:.2f} s (lease {r['lease_s']:g} s)" if "takeover_s" in r else ""
    print(
        f"{r['server']:8} N={r['clients']:4} hosts={r['hosts']:4} K={r['kernels']} "
        f"compiles={r['compiles']:3} wrong={r['wrong_bytes']}  p50 {r['p50_s']:6.2f} s  "
        f"p99 {r['p99_s']:6.2f} s  lone {r['lone_s']:5.2f} s  p99/lone {r['p99_over_lone']:.2f}  "
        f"req/client/kernel {r['per_client_kernel']:.2f}  req/host/kernel "
        f"{r['per_host_kernel']:.2f}  setup {r['setup_requests']}  "
        f"server {r['server_us_per_request'] or 0:.1f} us/req  "
        f"client cpu {r['client_cpu_ms_per_kernel']:.1f} ms/kernel{kill}",
        flush=True,
    )
    print(f"         requests: {r['requests']}", flush=True)
    print(f"         compiles (kernel, start, end): {r['compile_timeline']}", flush=True)


# -- capacity --------------------------------------------------------------------------
def capacity(servers: Servers) -> dict[str, Any]:
    """Requests per second each server sustains on this machine, and its CPU per request."""
    out: dict[str, Any] = {}
    bench = shutil.which("redis-benchmark")
    for server in ("redis", "cluster"):
        if server not in servers.urls or bench is None:
            continue
        port = servers.urls[server].rsplit(":", 1)[1].split("/")[0]
        row: dict[str, Any] = {}
        for name, cmd in (("get", ["GET", "cuforge:{k}"]),
                          ("evalsha_take", None), ("set_100k", ["SET", "cuforge:{k}", "x" * 100_000])):  # fmt: skip
            if cmd is None:
                continue
            args = [bench, "-p", port, "-n", "100000", "-c", "50", "-q"]
            if server == "cluster":
                args.append("--cluster")
            got = subprocess.run([*args, *cmd], capture_output=True, text=True, timeout=300)
            text = got.stdout.strip().splitlines()[-1] if got.stdout.strip() else got.stderr
            row[name] = text
        out[server] = row
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="200", help="client counts, comma-separated (200)")
    ap.add_argument("--per-host", type=int, default=8, help="ranks per simulated host (8)")
    ap.add_argument("--kernels", type=int, default=8, help="distinct kernels K (8)")
    ap.add_argument("--unroll", type=int, default=16, help="kernel size: 16 ~0.4 s, 32 ~1 s")
    ap.add_argument("--servers", default="redis,cluster,s3", help="redis,cluster,s3")
    ap.add_argument("--lease", type=float, default=30.0, help="lock_lease seconds (30)")
    ap.add_argument("--order", choices=("same", "shuffled"), default="same")
    ap.add_argument("--kill", action="store_true", help="SIGKILL one kernel's holder")
    ap.add_argument("--capacity", action="store_true", help="measure each server's capacity")
    ap.add_argument("--quick", action="store_true", help="24 clients, 4 kernels")
    ap.add_argument("--client", help=argparse.SUPPRESS)
    _results.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.client:
        client(json.loads(args.client))
        return 0
    counts = [24] if args.quick else [int(n) for n in args.clients.split(",")]
    kernels = 4 if args.quick else args.kernels
    which = args.servers.split(",")
    work = Path(tempfile.mkdtemp(prefix="herd-servers-"))
    servers = Servers(work, which)
    rows: list[dict[str, Any]] = []
    try:
        if args.capacity:
            cap = capacity(servers)
            print(json.dumps(cap, indent=1))
            _results.write(args.json, "bench_herd", {"capacity": cap}, args.note)
            return 0
        for server in which:
            ref = lone(servers, server, kernels, args.unroll, args.lease)
            print(f"{server}: lone client, {kernels} kernels cold: {ref['time_s']:.2f} s "
                  f"({ref['compiles']} compiles)", flush=True)  # fmt: skip
            for n in counts:
                got = run_herd(servers, server, n, args.per_host, kernels, args.unroll,
                               args.lease, args.order, kill=args.kill)  # fmt: skip
                rows.append(check(got, ref, ref["time_s"]))
                print_row(rows[-1])
    finally:
        servers.stop()
        shutil.rmtree(work, ignore_errors=True)
    _results.write(args.json, "bench_herd", {"runs": rows}, args.note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
