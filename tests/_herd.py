"""The herd (issue 35): client processes that cold-start on the same kernels at once.

Shared by ``tests/test_storage_herd.py`` (a dozen clients, the correctness of the
waiting paths) and ``benchmarks/bench_herd.py`` (hundreds, the numbers of
docs/scaling.md). Run as ``python tests/_herd.py '<job json>'``; each client is its
own Python process:

- it imports cuforge (and the server's client library: obstore for S3; Redis and a
  Redis Cluster are served by cuforge's own small client), opens its cache
  URL (a tier ``file://<its host's dir>,<fleet server>``: ranks of one simulated host
  share the directory), counts every request it sends to the fleet server (Redis:
  each command through the small client and through redis-py; S3: each obstore
  call), says it is ready and blocks on a file lock the harness holds -- the harness
  lets every client go at once;
- it compiles the K kernels (real NVRTC compiles; each one appends a line to the
  ``compiles`` file), records the sha256 of every cubin and when it had all K,
  writes its result and blocks again until the harness lets it close its cache.
  Its CPU time (``getrusage``, every thread's) is recorded for the start (the
  interpreter, imports, opening the cache) and for each kernel's ``compile()``,
  with its role in that kernel (``holder``: it compiled it; ``fleet``: its host's
  waiter on the fleet; ``host``: it waited on its host's lock and read the host's
  level); with a ``profile`` folder, a cProfile (CPU time) of each ``compile()``.
- ``victim``: the first process to compile that kernel says so in ``compiles`` and
  hangs in the compile (holding the kernel's locks) until the harness SIGKILLs it.

:func:`run` is the harness: it starts the clients, lets them go, kills the victim,
collects the results (:class:`Herd`) and calls ``mark`` at the common start and when
every client had all K (for the server-side counters a caller reads then).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ARCH = "sm_90"
#: What a connection sends once, before its first request (not per kernel).
SETUP_COMMANDS = ("hello", "client", "cluster", "command", "readonly", "ping", "auth", "select")
#: The fleet counters a handle sends every 64 operations or 10 s and at close (Redis
#: ``HINCRBY``; an S3 object under ``stats/``): per process and time, not per kernel.
COUNTER_REQUESTS = ("hincrby", "put stats")
#: The obstore calls the S3 backend makes.
S3_CALLS = ("get", "get_range", "put", "head", "delete", "list")


def kernel_source(i: int, unroll: int) -> str:
    """A real kernel ``herd_<i>``: a few hundred ms to compile at ``unroll`` 16 here."""
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


# -- counting what a client sends -------------------------------------------------------
def _tally(counts: dict[str, int], commands: Any) -> None:
    for command in commands:
        raw = command[0] if command else b"?"
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        key = name.split()[0].lower() if name.strip() else "?"
        counts[key] = counts.get(key, 0) + 1


def count_redis(counts: dict[str, int]) -> None:
    """Count every command this process sends to Redis (a pipeline of n: n), through
    the small client and through redis-py (patched when the backend imports it)."""
    from cuforge.storage.redis import _resp, _store

    roundtrip = _resp._Conn.roundtrip

    def counted_roundtrip(self: Any, commands: Any, *rest: Any) -> Any:
        _tally(counts, commands)
        return roundtrip(self, commands, *rest)

    _resp._Conn.roundtrip = counted_roundtrip  # type: ignore[method-assign]
    real_import = _store.redis_py

    def redis_py() -> Any:
        module = real_import()
        cls = module.connection.AbstractConnection
        if not getattr(cls, "_herd_counted", False):
            send, pack_many = cls.send_command, cls.pack_commands

            def send_command(self: Any, *args: Any, **kw: Any) -> Any:
                _tally(counts, [args])
                return send(self, *args, **kw)

            def pack_commands(self: Any, commands: Any) -> Any:
                commands = list(commands)
                _tally(counts, commands)
                return pack_many(self, commands)

            cls.send_command, cls.pack_commands = send_command, pack_commands
            cls._herd_counted = True
        return module

    _store.redis_py = redis_py


def count_s3(counts: dict[str, int]) -> None:
    """Count every obstore request this process makes (the S3 backend's only client)."""
    import obstore

    for name in S3_CALLS:
        real = getattr(obstore, name)

        def counted(*a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            path = a[1] if len(a) > 1 else kw.get("path", "")
            key = f"{_name} stats" if isinstance(path, str) and "/stats/" in path else _name
            counts[key] = counts.get(key, 0) + 1
            return _real(*a, **kw)

        setattr(obstore, name, counted)


def work_requests(sent: dict[str, int]) -> int:
    """Requests of ``sent`` for the kernels: not a connection's one-time set-up, not the
    periodic fleet counters."""
    return sum(v for k, v in sent.items() if k not in SETUP_COMMANDS + COUNTER_REQUESTS)


def counter_requests(sent: dict[str, int]) -> int:
    """Requests of ``sent`` that carried the fleet counters."""
    return sum(v for k, v in sent.items() if k in COUNTER_REQUESTS)


# -- the client -------------------------------------------------------------------------
def _block_on(path: str) -> None:
    """Wait (no polling) until the harness lets go of its exclusive lock on ``path``."""
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _small_cluster_client() -> bool:
    """Whether this cuforge's small Redis client speaks cluster (else its cluster ranks
    use redis-py, which the harness imports before the common start, as it did then:
    comparisons with an older checkout measure the herd, not that import)."""
    import importlib.util

    return importlib.util.find_spec("cuforge.storage.redis._cluster") is not None


def _cpu() -> float:
    """CPU seconds (user + system) this process used so far, every thread's."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _served(cache: Any) -> tuple[int, ...]:
    """Hits each level of the client's tier counted so far."""
    return tuple(s.hits for s in cache.level_stats())


def _role(before: tuple[int, ...], after: tuple[int, ...], compiled: bool) -> str:
    """What the client was for one kernel: ``holder`` (it compiled it), ``fleet``
    (its host's waiter on the fleet: a hit behind the host level), ``host`` (it
    waited on its host's lock, then hit the host level), ``miss`` (neither)."""
    if compiled:
        return "holder"
    gained = [a - b for a, b in zip(after, before, strict=True)]
    if any(gained[1:]):
        return "fleet"
    return "host" if gained and gained[0] else "miss"


def _profiler(job: dict[str, Any]) -> Any:
    """A cProfile (CPU seconds, not the waits) when the job names a ``profile`` folder
    (``bench_herd.py --profile``), else None."""
    if not job.get("profile"):
        return None
    import cProfile

    return cProfile.Profile(time.process_time)


def client(job: dict[str, Any]) -> None:
    """One rank: open the cache, wait for the start, compile every kernel, report."""
    from cuforge import Program, ProgramOptions
    from cuforge.compile import _nvrtc
    from cuforge.utils import open_cache

    sent: dict[str, int] = {}  # requests this client sent, by command
    (count_s3 if job["s3"] else count_redis)(sent)
    if "+cluster" in job["url"] and not _small_cluster_client():
        import redis.cluster  # noqa: F401  # an older cuforge: redis-py, imported before the start
    real = _nvrtc.compile_cpp
    victim = job.get("victim")
    compiles = [0]  # real compiles this process made

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
        compiles[0] += 1
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
    cpu_start = _cpu()  # the interpreter's start, imports, opening the cache
    _block_on(job["go"])
    shas, roles, cpu_k, profiles, wall_k = {}, {}, {}, {}, {}
    for k in order:
        profile = profiles[k] = _profiler(job)
        before, compiled, c0 = _served(cache), compiles[0], _cpu()
        if profile is not None:
            profile.enable()
        t0 = time.monotonic()
        obj = Program(sources[k], "c++", options=opts).compile("cubin", cache=cache)
        wall_k[k] = (t0, time.monotonic())
        if profile is not None:
            profile.disable()
        cpu_k[k] = _cpu() - c0
        roles[k] = _role(before, _served(cache), compiles[0] > compiled)
        shas[k] = hashlib.sha256(obj.code).hexdigest()
    done = time.monotonic()
    cpu_s = sum(cpu_k.values())  # inside compile(): not the harness's own work
    for n, (k, profile) in enumerate(profiles.items()):  # <role>.<client>.<kernel>
        if profile is not None:
            role = f"first-{roles[k]}" if n == 0 else roles[k]
            profile.dump_stats(os.path.join(job["profile"], f"{role}.{job['i']}.{k}"))
    result = {
        "i": job["i"], "host": job["host"], "pid": os.getpid(), "done": done, "shas": shas,
        "cpu_s": cpu_s, "cpu_start_s": cpu_start, "cpu_kernel_s": cpu_k, "roles": roles,
        "wall_kernel": wall_k,
        "sent": dict(sent), "stats": cache.stats().as_dict(),
    }  # fmt: skip
    tmp = Path(job["dir"], f".result.{job['i']}")
    tmp.write_text(json.dumps(result))
    tmp.rename(Path(job["dir"], f"result.{job['i']}"))
    _block_on(job["exit"])
    cache.close()


# -- the harness ------------------------------------------------------------------------
class Herd:
    """What one cold start of the herd did.

    ``results``: each surviving client's result (``sent``: requests by command until
    it had all K; ``shas``; ``done``: when, monotonic); ``compiles``: every real
    compile, ``(pid, kernel, start, end)`` (end None: the victim's, killed); ``t_go``:
    the common start; ``t_all``: when every client had all K; ``t_kill``: when the
    victim was killed (None: no victim)."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []
        self.compiles: list[tuple[int, int, float, float | None]] = []
        self.t_go = self.t_all = 0.0
        self.t_kill: float | None = None
        self.victim_pid: int | None = None

    def finished(self) -> list[tuple[int, int, float, float | None]]:
        """The compiles that completed."""
        return [c for c in self.compiles if c[3] is not None]

    def requests(self, host: int | None = None) -> int:
        """Fleet requests (set-up apart) the clients (of ``host``) sent until all K."""
        return sum(
            work_requests(r["sent"]) for r in self.results if host is None or r["host"] == host
        )


def run(
    work: Path, url_of: Callable[[int], str], clients: int, per_host: int, kernels: int,
    unroll: int, *, s3: bool, env: dict[str, str] | None = None, order: str = "same",
    victim: int | None = None, kill_after: float = 0.3, timeout: float = 600,
    mark: Callable[[str], None] | None = None, profile: str | None = None,
) -> Herd:  # fmt: skip
    """Start ``clients`` processes, ``per_host`` to a simulated host (``url_of(host)``
    is a host's cache URL), let them go at once, wait until each has all ``kernels``;
    SIGKILL the ``victim`` kernel's first compiler ``kill_after`` seconds into its
    compile. ``mark("go")`` runs just before the start, ``mark("all")`` when every
    client had all K. RuntimeError with a client's log when one fails or the herd
    takes longer than ``timeout`` seconds."""
    work.mkdir(parents=True, exist_ok=True)
    go, leave = work / "go.lock", work / "exit.lock"
    go_fd = os.open(go, os.O_CREAT | os.O_RDWR, 0o600)
    exit_fd = os.open(leave, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(go_fd, fcntl.LOCK_EX)
    fcntl.flock(exit_fd, fcntl.LOCK_EX)
    counter = work / "compiles"
    counter.touch()
    procs: list[subprocess.Popen[bytes]] = []
    herd = Herd()
    try:
        for i in range(clients):
            job = {
                "i": i, "host": i // per_host, "url": url_of(i // per_host), "dir": str(work),
                "go": str(go), "exit": str(leave), "counter": str(counter), "kernels": kernels,
                "unroll": unroll, "order": order, "s3": s3, "victim": victim,
                "victim_mark": str(work / "victim"), "profile": profile,
            }  # fmt: skip
            args = [sys.executable, __file__, json.dumps(job)]
            with open(work / f"log.{i}", "wb") as log:
                procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + timeout
        while sum(1 for n in os.listdir(work) if n.startswith("ready.")) < clients:
            _check(work, procs, deadline, "start")
            time.sleep(0.05)
        if mark is not None:
            mark("go")
        herd.t_go = time.monotonic()
        fcntl.flock(go_fd, fcntl.LOCK_UN)
        alive = clients
        while sum(1 for n in os.listdir(work) if n.startswith("result.")) < alive:
            _check(work, procs, deadline, "finish")
            if victim is not None and herd.t_kill is None:
                for line in counter.read_text().splitlines():
                    if line.endswith("victim"):
                        herd.victim_pid = int(line.split()[0])
                        time.sleep(kill_after)  # in the middle of its compile
                        os.kill(herd.victim_pid, signal.SIGKILL)
                        herd.t_kill = time.monotonic()
                        alive -= 1
            time.sleep(0.02)
        herd.t_all = time.monotonic()
        if mark is not None:
            mark("all")
        fcntl.flock(exit_fd, fcntl.LOCK_UN)
        for p in procs:
            p.wait(timeout=120)
        herd.results = [
            json.loads((work / n).read_text()) for n in os.listdir(work) if n.startswith("result.")
        ]
        for line in counter.read_text().splitlines():
            f = line.split()
            end = None if f[3] == "victim" else float(f[3])
            herd.compiles.append((int(f[0]), int(f[1]), float(f[2]), end))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        os.close(go_fd)
        os.close(exit_fd)
    return herd


def _check(work: Path, procs: list[subprocess.Popen[bytes]], deadline: float, what: str) -> None:
    for i, p in enumerate(procs):
        if p.poll() not in (None, 0, -signal.SIGKILL):
            log = (work / f"log.{i}").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"herd client {i} exited {p.returncode}:\n{log}")
    if time.monotonic() > deadline:
        raise RuntimeError(f"the herd did not {what} in time")


if __name__ == "__main__":
    client(json.loads(sys.argv[1]))
