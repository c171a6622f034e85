"""Memory under load, in a fresh interpreter: hits over a key set, RSS sampled.

    python _memworker.py <spec-json>        # prints one JSON line

``spec``: ``url`` (``open_cache``; ``secret`` signs), ``keys``, ``hits``, ``value``
(bytes per value); or ``compile`` (a directory holding ``programs`` header-tracked
sources compiled once, then hit ``hits`` times in all). RSS is read from
/proc/self/statm after a warm-up pass over every key (the baseline) and every 10% of
the hits; the result holds baseline, peak and final RSS and the hits per second.
"""

from __future__ import annotations

import gc
import json
import os
import random
import sys
import time
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def cache_hits(spec: dict[str, Any]) -> dict[str, Any]:
    from cuforge.utils import open_cache

    cache = open_cache(spec["url"], secret=spec.get("secret"))
    keys = [f"mem-{i:05d}".encode() for i in range(spec["keys"])]
    value = os.urandom(spec["value"])
    for key in keys:
        cache[key] = value
    rng = random.Random(15)
    order = list(keys)
    for _ in range(2):  # warm-up: every key read, every memo at its steady size
        rng.shuffle(order)
        for key in order:
            assert cache.get(key) == value
    gc.collect()
    base = peak = rss()
    n, step = spec["hits"], max(1, spec["hits"] // 10)
    start = time.perf_counter()
    for i in range(n):
        if cache.get(keys[rng.randrange(len(keys))]) is None:
            raise AssertionError("a stored key missed")
        if i % step == step - 1:
            peak = max(peak, rss())
    took = time.perf_counter() - start
    stats = cache.stats()
    cache.close()
    gc.collect()
    return {"base": base, "peak": peak, "final": rss(), "hits_per_s": n / took,
            "hits": stats.hits}  # fmt: skip


def compile_hits(spec: dict[str, Any]) -> dict[str, Any]:
    from cuforge.compile import Program, ProgramOptions
    from cuforge.storage import InMemoryProgramCache

    root = spec["compile"]
    cache = InMemoryProgramCache()
    options = ProgramOptions(arch="sm_90", include_path=[os.path.join(root, "inc")])
    sources = []
    for i in range(spec["programs"]):
        with open(os.path.join(root, f"p{i}.cu")) as f:
            sources.append(f.read())
    reference = [Program(s, "c++", options).compile("ptx", cache=cache).code for s in sources]
    for _ in range(2):
        for s, ref in zip(sources, reference, strict=True):
            assert Program(s, "c++", options).compile("ptx", cache=cache).code == ref
    gc.collect()
    base = peak = rss()
    n, step = spec["hits"], max(1, spec["hits"] // 10)
    rng = random.Random(15)
    start = time.perf_counter()
    for i in range(n):
        j = rng.randrange(len(sources))
        if Program(sources[j], "c++", options).compile("ptx", cache=cache).code != reference[j]:
            raise AssertionError("a hit returned other code")
        if i % step == step - 1:
            peak = max(peak, rss())
    took = time.perf_counter() - start
    gc.collect()
    return {"base": base, "peak": peak, "final": rss(), "hits_per_s": n / took,
            "hits": cache.stats().hits}  # fmt: skip


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    result = compile_hits(spec) if spec.get("compile") else cache_hits(spec)
    print(json.dumps(result))
