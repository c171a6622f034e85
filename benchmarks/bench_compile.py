"""Compile-layer cache benchmarks: key derivation, the compile-with-cache hit, miss overhead,
a CUB kernel's miss and hit, and what the toolkit header-set identity adds to a hit.

Every function takes an ``api`` namespace (``Program``, ``ProgramOptions``,
``FileStreamProgramCache``, ``make_program_cache_key``) so the same code measures
cuforge and cuda.core; ``run.py`` prints them side by side.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import timeit
from types import SimpleNamespace
from typing import Any

from bench_storage import _timed_calls

# A 1 KB source: a real kernel padded with a comment to the size the targets name.
_KERNEL = 'extern "C" __global__ void scale(float* a, float s) { a[threadIdx.x] *= s; }\n'
SOURCE_1KB = _KERNEL + "// " + "x" * (1024 - len(_KERNEL) - 4) + "\n"


def bench_key(api: SimpleNamespace, n: int = 20000) -> float:
    """Median microseconds of ``make_program_cache_key`` for a 1 KB C++ source."""
    opts = api.ProgramOptions(arch="sm_90")

    def key() -> bytes:
        return api.make_program_cache_key(
            code=SOURCE_1KB, code_type="c++", options=opts, target_type="cubin"
        )

    _timed_calls(key, 1000)
    return statistics.median(_timed_calls(key, n)) * 1e6


def bench_hit(api: SimpleNamespace, n: int = 10000) -> float:
    """Median microseconds of ``Program(src).compile("cubin", cache=FileStream)`` on a hit.

    Options are built once, as a library that JITs many kernels would; the
    ``Program`` is built per call, as the cuda.core idiom does.
    """
    opts = api.ProgramOptions(arch="sm_90")
    with api.FileStreamProgramCache(tempfile.mkdtemp(prefix="bench-hit-")) as cache:
        api.Program(SOURCE_1KB, "c++", options=opts).compile("cubin", cache=cache)

        def hit() -> Any:
            return api.Program(SOURCE_1KB, "c++", options=opts).compile("cubin", cache=cache)

        _timed_calls(hit, 1000)
        return statistics.median(_timed_calls(hit, n)) * 1e6


def bench_miss_overhead(api: SimpleNamespace, rounds: int = 12) -> tuple[float, float, float]:
    """(uncached ms, cached-miss ms, overhead %) for a cold 1 KB compile, medians.

    Each round compiles a fresh source (a unique constant) once without a cache and
    once through an empty FileStream cache, alternating so drift hits both equally.
    """
    opts = api.ProgramOptions(arch="sm_90")
    plain, cached = [], []
    for i in range(rounds):
        for j, sink in enumerate((plain, cached)):
            src = SOURCE_1KB.replace("*= s", f"*= s + {i * 2 + j}.0f")
            t0 = time.perf_counter()
            if sink is plain:
                api.Program(src, "c++", options=opts).compile("cubin")
            else:
                with api.FileStreamProgramCache(tempfile.mkdtemp(prefix="bench-miss-")) as c:
                    t0 = time.perf_counter()  # opening the cache is not the miss
                    api.Program(src, "c++", options=opts).compile("cubin", cache=c)
            sink.append(time.perf_counter() - t0)
    p, c = statistics.median(plain), statistics.median(cached)
    return p * 1e3, c * 1e3, (c - p) / p * 100


# A real JIT kernel's includes: CUB block primitives (~2 s of NVRTC on a miss).
CUB_SOURCE = r"""
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
extern "C" __global__ void block_sum_scan(const int* in, int* sums, int* scans) {
    using Reduce = cub::BlockReduce<int, 256>;
    using Scan = cub::BlockScan<int, 256>;
    __shared__ typename Reduce::TempStorage reduce_tmp;
    __shared__ typename Scan::TempStorage scan_tmp;
    int i = blockIdx.x * 256 + threadIdx.x;
    int v = in[i];
    int total = Reduce(reduce_tmp).Sum(v);
    if (threadIdx.x == 0) sums[blockIdx.x] = total;
    int prefix;
    Scan(scan_tmp).InclusiveSum(v, prefix);
    scans[i] = prefix;
}
"""


def _cub_options(api: SimpleNamespace, include_dirs: tuple[str, ...]) -> Any:
    extra = {"include_path": list(include_dirs)} if include_dirs else {}
    return api.ProgramOptions(arch="sm_90", **extra)


def bench_cub_misses(
    apis: list[tuple[SimpleNamespace, tuple[str, ...]]], rounds: int = 3
) -> list[float]:
    """Median ms of a CUB-kernel miss through an empty FileStream cache, per api.

    Each ``(api, include_dirs)``: cuforge needs no include options; cuda.core is
    handed the directories cuforge found. Where a cache refuses include paths, the
    miss is timed as an uncached compile. Each round compiles a fresh source (the
    headers then come from the OS file cache for every library alike) and the
    libraries take turns going first.
    """
    times: list[list[float]] = [[] for _ in apis]
    for r in range(rounds):
        order = list(range(len(apis)))
        if r % 2:
            order.reverse()
        for i in order:
            api, dirs = apis[i]
            src = CUB_SOURCE + f"// round {r} of api {i}\n"
            opts = _cub_options(api, dirs)
            with api.FileStreamProgramCache(tempfile.mkdtemp(prefix="bench-cub-")) as cache:
                t0 = time.perf_counter()
                try:
                    api.Program(src, "c++", options=opts).compile("cubin", cache=cache)
                except ValueError:  # a key that cannot see the include paths' content
                    t0 = time.perf_counter()
                    api.Program(src, "c++", options=opts).compile("cubin")
                times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]


def bench_cub_hit(
    api: SimpleNamespace, include_dirs: tuple[str, ...] = (), hits: int = 2000
) -> float | None:
    """Median us of a CUB-kernel hit through a FileStream cache; None where the
    cache refuses include paths."""
    opts = _cub_options(api, include_dirs)
    with api.FileStreamProgramCache(tempfile.mkdtemp(prefix="bench-cub-hit-")) as cache:
        try:
            api.Program(CUB_SOURCE, "c++", options=opts).compile("cubin", cache=cache)
        except ValueError:
            return None

        def hit() -> Any:
            return api.Program(CUB_SOURCE, "c++", options=opts).compile("cubin", cache=cache)

        _timed_calls(hit, min(hits, 500))
        return statistics.median(_timed_calls(hit, hits)) * 1e6


def bench_header_identity(n: int = 1_000_000, relocations: int = 30) -> tuple[float, float]:
    """(ns the header-set identity adds to each hit, ms to locate and fingerprint the
    header sets once per process -- medians, file system cache warm).

    The per-hit cost is the C++ backend's identity (compiler + headers) minus the
    compiler's identity alone, which is what a key took before header sets.
    """
    from cuforge.compile.cache import _identity, _toolkit, cache_key

    backend = cache_key._BACKENDS["c++"]
    backend.identity()
    runs = []
    for _ in range(5):
        both = timeit.timeit(backend.identity, number=n) / n
        plain = timeit.timeit(_identity.nvrtc_identity, number=n) / n
        runs.append(both - plain)
    locate = []
    for _ in range(relocations):
        _toolkit._reset()
        t0 = time.perf_counter()
        _toolkit.toolkit_identity()
        locate.append(time.perf_counter() - t0)
    return statistics.median(runs) * 1e9, statistics.median(locate) * 1e3


def cuforge_api() -> SimpleNamespace:
    from cuforge import Program, ProgramOptions
    from cuforge.utils import FileStreamProgramCache, make_program_cache_key

    return SimpleNamespace(
        Program=Program,
        ProgramOptions=ProgramOptions,
        FileStreamProgramCache=FileStreamProgramCache,
        make_program_cache_key=make_program_cache_key,
    )


def cuda_core_api() -> SimpleNamespace | None:
    """The same namespace over cuda.core, or None where cuda-core is not installed."""
    try:
        from cuda.core import Program, ProgramOptions
        from cuda.core.utils import FileStreamProgramCache, make_program_cache_key
    except ImportError:
        return None
    return SimpleNamespace(
        Program=Program,
        ProgramOptions=ProgramOptions,
        FileStreamProgramCache=FileStreamProgramCache,
        make_program_cache_key=make_program_cache_key,
    )
