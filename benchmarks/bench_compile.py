"""Compile-layer cache benchmarks: key derivation, the compile-with-cache hit, miss overhead.

Every function takes an ``api`` namespace (``Program``, ``ProgramOptions``,
``FileStreamProgramCache``, ``make_program_cache_key``) so the same code measures
cuforge and cuda.core; ``run.py`` prints them side by side.
"""

from __future__ import annotations

import statistics
import tempfile
import time
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
