"""Warm-set prefetch against one bulk transfer of the same bytes, and against one get
after another, from a real redis-server and a real SeaweedFS S3 on loopback.

    python benchmarks/bench_warmset.py [--entries 1000] [--size 32768] [--rounds 3]

Each round, for each backend: N entries of SIZE random bytes are in the shared cache
and a warm set lists them. Three ways to bring them into an empty local directory:

- ``bulk``: the same N x SIZE bytes as ONE value/object (a Redis GET, an S3 GET),
  written to one local file -- the floor a tarball-style restore cannot beat;
- ``prefetch``: ``cuforge.integrations.warmsets.prefetch`` through the tier
  ``file:///<empty dir>,<shared>`` (the set loaded first, included in the time);
- ``one by one``: ``get_entry`` of each key in turn through the same kind of tier
  (what a job without a warm set does as it asks).

Prints each configuration's best time over the rounds and the ratios
``prefetch / bulk`` (goal <= 2) and ``one by one / prefetch`` (goal >= 10).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "src"))


def _fill(url: str, n: int, size: int) -> list[bytes]:
    from cuforge.integrations import warmsets
    from cuforge.storage.urls import open_cache

    keys = [b"bench-warm\0" + str(i).encode() for i in range(n)]
    with open_cache(url) as cache:
        for k in keys:
            cache.set_entry(k, os.urandom(size), b'{"kind":"raw","v":1}')
        warmsets.store(cache, "bench", keys)
    return keys


def _prefetch(shared: str, local: str) -> float:
    from cuforge.integrations import warmsets
    from cuforge.storage.urls import open_cache

    start = time.perf_counter()
    with open_cache(f"file://{local},{shared}") as cache:
        tier = warmsets.local_tier(cache)
        assert tier is not None
        keys = warmsets.load(cache, "bench")
        assert keys is not None
        done = warmsets.prefetch(tier, keys)
    took = time.perf_counter() - start
    assert done.fetched == len(keys), done
    return took


def _one_by_one(shared: str, local: str, keys: list[bytes]) -> float:
    from cuforge.storage.urls import open_cache

    start = time.perf_counter()
    with open_cache(f"file://{local},{shared}") as cache:
        got = sum(cache.get_entry(k) is not None for k in keys)
    took = time.perf_counter() - start
    assert got == len(keys)
    return took


def _bulk_redis(client: object, local: str) -> float:
    start = time.perf_counter()
    data = client.get(b"bench-bulk")  # type: ignore[attr-defined]
    with open(os.path.join(local, "bulk"), "wb") as f:
        f.write(data)
    return time.perf_counter() - start


def _bulk_s3(store: object, local: str) -> float:
    import obstore

    start = time.perf_counter()
    data = obstore.get(store, "bench-bulk").bytes()
    with open(os.path.join(local, "bulk"), "wb") as f:
        f.write(bytes(data))
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--size", type=int, default=32 << 10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=("redis", "s3"), default=None)
    args = ap.parse_args()
    from _redis import RedisServer
    from _s3 import SeaweedServer

    work = Path(tempfile.mkdtemp(prefix="bench-warmset-"))
    servers: list[object] = []
    results: dict[str, dict[str, list[float]]] = {}
    try:
        backends: dict[str, tuple[str, object, object]] = {}
        if args.only in (None, "redis"):
            redis = RedisServer(work / "redis")
            servers.append(redis)
            client = redis.client()
            client.set(b"bench-bulk", os.urandom(args.entries * args.size))
            backends["redis"] = (redis.url, client, _bulk_redis)
        if args.only in (None, "s3"):
            (work / "s3").mkdir()
            s3 = SeaweedServer(work / "s3")
            servers.append(s3)
            os.environ.update(SeaweedServer.client_env())
            import obstore

            raw = s3.raw()
            obstore.put(raw, "bench-bulk", os.urandom(args.entries * args.size))
            backends["s3"] = (s3.url(), raw, _bulk_s3)
        keys = {name: _fill(url, args.entries, args.size) for name, (url, _, _) in backends.items()}
        for r in range(args.rounds):
            for name, (url, handle, bulk) in backends.items():
                times = results.setdefault(name, {})
                for what in ("bulk", "prefetch", "one by one"):
                    local = tempfile.mkdtemp(dir=work, prefix=f"local-{r}-")
                    if what == "bulk":
                        took = bulk(handle, local)  # type: ignore[operator]
                    elif what == "prefetch":
                        took = _prefetch(url, local)
                    else:
                        took = _one_by_one(url, local, keys[name])
                    times.setdefault(what, []).append(took)
                    shutil.rmtree(local, ignore_errors=True)
        mib = args.entries * args.size / (1 << 20)
        print(f"{args.entries} entries x {args.size // 1024} KiB = {mib:.1f} MiB, "
              f"{args.rounds} rounds, best (median) seconds")  # fmt: skip
        for name, times in results.items():
            best = {w: min(t) for w, t in times.items()}
            med = {w: statistics.median(t) for w, t in times.items()}
            cells = "  ".join(f"{w}: {best[w]:.3f} ({med[w]:.3f})" for w in best)
            print(f"{name:6s} {cells}")
            print(
                f"{name:6s} prefetch / bulk = {best['prefetch'] / best['bulk']:.2f} (goal <= 2); "
                f"one by one / prefetch = {best['one by one'] / best['prefetch']:.1f} (goal >= 10)"
            )
    finally:
        for server in servers:
            server.stop() if hasattr(server, "stop") else server.kill()  # type: ignore[attr-defined]
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
