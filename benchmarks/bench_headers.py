"""Header tracking: what a hit costs with a 20-header manifest, what a miss pays to resolve.

- ``hit``: median µs of ``Program(src).compile("cubin", cache=...)`` on a hit, for a
  kernel that includes 20 headers through ``include_path``, beside the plain hit (a
  kernel with no includes) on the same cache -- with the change watcher (a long-lived
  process) and without it (``CUFORGE_WATCH=0``: every hit stats each header). The
  peer is cuda.core 1.2.2 doing what its users must: fingerprint the 20 headers
  themselves, pass ``extra_digest=`` to ``make_program_cache_key``, look the key up.
- ``miss``: median ms of a cold compile of that kernel without a cache and as a miss
  of a FileStream cache in use (dependency resolution, closed-world compile, entry and
  manifest writes); the tracking overhead is isolated by compiling the same kernel
  with its headers inlined the same two ways (see ``bench_miss``).

Headers are made older than two seconds first, as real headers are: cuforge does not
trust the stat of a file younger than that (see ``compile/_manifest.py``).

    python benchmarks/bench_headers.py [--quick] [--json PATH]   # prints the table
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import _results
from bench_storage import _timed_calls

N_HEADERS = 20
KERNEL = 'extern "C" __global__ void scale(float* a, float s) { a[threadIdx.x] *= s + H3; }\n'


def _header(i: int) -> str:
    """A header of a typical size: a macro and eight small device function templates,
    of which a kernel instantiates one."""
    funcs = "".join(
        f"template <typename T> __device__ T f{i}_{j}(T x) {{\n"
        f"    // step {j} of a small numeric helper\n"
        f"    T y = x * T({i + j + 1});\n"
        f"    return y + T(H{i}) - T({j});\n}}\n"
        for j in range(8)
    )
    return f"#pragma once\n#define H{i} {i}\n// helpers, part {i}\n" + funcs


def make_tree(root: str) -> tuple[str, str, list[str]]:
    """An include dir of 20 headers; returns (dir, source, header paths)."""
    inc = os.path.join(root, "inc")
    os.makedirs(inc, exist_ok=True)
    paths = []
    for i in range(N_HEADERS):
        path = os.path.join(inc, f"h{i}.h")
        with open(path, "w") as f:
            f.write(_header(i))
        paths.append(path)
    calls = " + ".join(f"f{i}_{i % 8}(a[threadIdx.x])" for i in range(N_HEADERS))
    kernel = KERNEL.replace("*= s + H3;", f"*= s + H3 + {calls};")
    source = "".join(f'#include "h{i}.h"\n' for i in range(N_HEADERS)) + kernel
    return inc, source, paths


def inlined(source: str, inc: str) -> str:
    """``source`` with every include replaced by the header's text: the same compile
    work for NVRTC, and nothing for the cache to track."""
    out = []
    for line in source.splitlines(keepends=True):
        if line.startswith('#include "'):
            with open(os.path.join(inc, line.split('"')[1])) as f:
                out.append(f.read())
        else:
            out.append(line)
    return "".join(out)


def bench_hits(n: int = 5000) -> dict[str, float]:
    """Medians (µs) of the plain and the 20-header hit, FileStream and InMemory."""
    from cuforge import Program, ProgramOptions
    from cuforge.utils import FileStreamProgramCache, InMemoryProgramCache

    root = tempfile.mkdtemp(prefix="bench-headers-")
    try:
        inc, source, _ = make_tree(root)
        time.sleep(2.1)  # headers as old as real ones
        plain_src = KERNEL.replace("H3", "3")
        opts = ProgramOptions(arch="sm_90", include_path=[inc])
        popts = ProgramOptions(arch="sm_90")
        out: dict[str, float] = {}
        for label, make in (
            ("filestream", lambda: FileStreamProgramCache(os.path.join(root, "c"))),
            ("memory", InMemoryProgramCache),
        ):
            with make() as cache:
                Program(plain_src, "c++", popts).compile("cubin", cache=cache)
                Program(source, "c++", opts).compile("cubin", cache=cache)

                def plain(c: Any = cache) -> Any:
                    return Program(plain_src, "c++", popts).compile("cubin", cache=c)

                def tracked(c: Any = cache) -> Any:
                    return Program(source, "c++", opts).compile("cubin", cache=c)

                _timed_calls(plain, 500)
                _timed_calls(tracked, 500)
                out[f"{label} plain"] = statistics.median(_timed_calls(plain, n)) * 1e6
                out[f"{label} 20 headers"] = statistics.median(_timed_calls(tracked, n)) * 1e6
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_cuda_core_hit(n: int = 5000) -> float | None:
    """Median µs of the cuda.core idiom: fingerprint 20 headers, key, get, wrap."""
    try:
        from cuda.core import ObjectCode, Program, ProgramOptions
        from cuda.core.utils import FileStreamProgramCache, make_program_cache_key
    except ImportError:
        return None
    import hashlib

    root = tempfile.mkdtemp(prefix="bench-headers-cc-")
    try:
        inc, source, paths = make_tree(root)
        opts = ProgramOptions(arch="sm_90", include_path=[inc])
        with FileStreamProgramCache(os.path.join(root, "c")) as cache:

            def fingerprint() -> bytes:
                h = hashlib.blake2b(digest_size=32)
                for p in paths:
                    with open(p, "rb") as f:
                        h.update(f.read())
                return h.digest()

            key = make_program_cache_key(
                code=source, code_type="c++", options=opts, target_type="cubin",
                extra_digest=fingerprint(),
            )  # fmt: skip
            cache[key] = Program(source, "c++", options=opts).compile("cubin")

            def hit() -> Any:
                k = make_program_cache_key(
                    code=source, code_type="c++", options=opts, target_type="cubin",
                    extra_digest=fingerprint(),
                )  # fmt: skip
                return ObjectCode.from_cubin(cache[k])

            _timed_calls(hit, 500)
            return statistics.median(_timed_calls(hit, n)) * 1e6
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_miss(rounds: int = 9) -> dict[str, float]:
    """Medians (ms) of cold compiles of the 20-header kernel and of the same kernel
    with its headers inlined, each uncached and as a miss of a FileStream cache.

    ``tracking %`` is what header tracking adds (resolution, manifest) beyond what any
    cached miss pays, over the uncached compile: the median over rounds of
    ((tracked miss - uncached) - (inlined miss - inlined uncached)), each round's four
    compiles back to back, so a slow spell of the machine cancels out within a round.
    ``resolve ms`` is the resolution alone (read and scan the 20 headers; median of
    200), the part of that overhead a cached miss cannot share with other misses.
    """
    from cuforge import Program, ProgramOptions
    from cuforge.compile.cache import _includes, _tracking
    from cuforge.utils import FileStreamProgramCache

    root = tempfile.mkdtemp(prefix="bench-headers-miss-")
    try:
        inc, source, _ = make_tree(root)
        flat = inlined(source, inc)
        opts = ProgramOptions(arch="sm_90", include_path=[inc])
        times: dict[str, list[float]] = {"u": [], "c": [], "fu": [], "fc": []}
        # One cache in use, as in a real process: every shard directory exists.
        with FileStreamProgramCache(os.path.join(root, "cache")) as cache:
            cache.update((f"filler-{n}", b"x" * 64) for n in range(2048))
            for i in range(rounds):
                for j, kind in enumerate(("u", "c", "fu", "fc")):
                    base = flat if kind.startswith("f") else source
                    src = base.replace("s + H3", f"s + H3 + {i * 4 + j}.0f")
                    t0 = time.perf_counter()
                    if kind.endswith("u"):
                        Program(src, "c++", opts).compile("cubin")
                    else:
                        Program(src, "c++", opts).compile("cubin", cache=cache)
                    times[kind].append(time.perf_counter() - t0)
        program = Program(source, "c++", opts)
        roots = _tracking.roots_if_tracked(program)
        assert roots is not None
        resolve_s = []
        for _ in range(200):
            t0 = time.perf_counter()
            _includes.resolve(program.source.code, "<source>", roots)
            resolve_s.append(time.perf_counter() - t0)
        m = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        extra = [
            (c - u) - (fc - fu)
            for u, c, fu, fc in zip(times["u"], times["c"], times["fu"], times["fc"], strict=True)
        ]
        m["total %"] = (m["c"] - m["u"]) / m["u"] * 100
        m["tracking ms"] = statistics.median(extra) * 1e3
        m["tracking %"] = m["tracking ms"] / m["u"] * 100
        m["resolve ms"] = statistics.median(resolve_s) * 1e3
        m["file create us"] = create_latency_us()
        return m
    finally:
        shutil.rmtree(root, ignore_errors=True)


def create_latency_us(n: int = 300) -> float:
    """Median µs to create (and fill) a small file here: what one FileStream write
    pays twice, so the miss row can be read against the machine's disk."""
    root = tempfile.mkdtemp(prefix="bench-headers-create-")
    try:
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            fd = os.open(os.path.join(root, f"f{i}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, b"x" * 512)
            os.close(fd)
            out.append(time.perf_counter() - t0)
        return statistics.median(out) * 1e6
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _unwatched_hits(n: int) -> dict[str, float]:
    """bench_hits in a child process with the watcher off (it is per process)."""
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); import bench_headers as b; "
        f"print(json.dumps(b.bench_hits({n})))"
    )
    env = {**os.environ, "CUFORGE_WATCH": "0"}
    done = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__))],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    import json

    return json.loads(done.stdout)


def measure(quick: bool = False) -> dict[str, Any]:
    """Every number of the table, raw: hit medians (us) with and without the
    watcher, cuda.core's idiom (us, None without cuda-core), miss medians (ms)."""
    n = 1000 if quick else 5000
    return {
        "hits": n,
        "hit_us_watched": bench_hits(n),
        "hit_us_unwatched": _unwatched_hits(n),
        "cuda_core_hit_us": bench_cuda_core_hit(n),
        "miss_ms": bench_miss(5 if quick else 25),
    }


def rows(quick: bool = False, raw: dict[str, Any] | None = None) -> list[tuple[str, ...]]:
    """Table rows (measurement, cuforge, cuda.core, ratio, target) for run.py; from
    ``raw`` (what ``measure`` returns) when given, else measured now."""
    raw = raw or measure(quick)
    watched, unwatched = raw["hit_us_watched"], raw["hit_us_unwatched"]
    cc = raw["cuda_core_hit_us"]
    out = []
    for label in ("filestream", "memory"):
        plain, tracked = watched[f"{label} plain"], watched[f"{label} 20 headers"]
        out.append((
            f"{label} hit, 20 headers (plain {plain:.1f} us)",
            f"{tracked:.1f} us",
            f"{cc:.1f} us" if cc and label == "filestream" else "-",
            f"{tracked / plain:.2f}x plain",
            "<= 2x plain",
        ))  # fmt: skip
        stat_only = unwatched[f"{label} 20 headers"]
        out.append((
            "  without the watcher (stat each header)",
            f"{stat_only:.1f} us",
            "",
            f"{stat_only / unwatched[f'{label} plain']:.2f}x plain",
            "",
        ))  # fmt: skip
    m = raw["miss_ms"]
    out.append(("miss, 20 headers: tracking overhead", f"{m['tracking %']:+.2f} %", "-", "-",
                "<= 5 %"))  # fmt: skip
    out.append((
        "  (of which resolving the 20 headers)",
        f"{m['resolve ms']:.2f} ms = {m['resolve ms'] / m['u'] * 100:.1f} %", "", "", "",
    ))  # fmt: skip
    if "file create us" in m:
        out.append((
            "  (this disk: creating a small file)", f"{m['file create us']:.0f} us", "", "", "",
        ))  # fmt: skip
    out.append((
        "  (uncached / cached miss / all cache costs)",
        f"{m['u']:.1f}/{m['c']:.1f} ms, {m['total %']:+.1f} %", "", "", "",
    ))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer hits and miss rounds")
    _results.add_arguments(ap)
    args = ap.parse_args(argv)
    raw = measure(args.quick)
    table = rows(raw=raw)
    head = ("measurement", "cuforge", "cuda.core 1.2.2", "ratio", "target")
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(5)]
    for r in [head, *table]:
        print("  ".join(f"{c:<{widths[i]}}" if i == 0 else f"{c:>{widths[i]}}"
                        for i, c in enumerate(r)))  # fmt: skip
    _results.write(args.json, "bench_headers", raw, args.note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
