"""Inductor's remote FX-graph cache: a lookup through cuforge beside Inductor's own
Redis backend, on one private redis-server, in one run.

Times ``RemoteFxGraphCache("fx-graph-v1").get(key)`` -- what Inductor calls per
lookup, JSON decoding included -- for one warm value of ``--size`` bytes (an FX-graph
entry is tens of KiB): stock (``RedisRemoteCacheBackend``, redis-py), then
``cuforge.integrations.inductor.install()`` on the same server unsigned and signed,
and on a local FileStream directory signed. The ratio column is to stock; cuforge
adds an integrity check on every read, and signing an HMAC over the value.

    python benchmarks/bench_inductor.py [--size 65536] [-n 5000] [--rounds 5] [--json PATH]

Needs torch, redis-py and redis-server (make test-integrations installs the first two).
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _results
from bench_fleet import redis_available, redis_server
from bench_storage import _timed_calls

SECRET = "bench-inductor-secret-0123456789abcdef"


def _value(size: int) -> dict[str, Any]:
    """An FX-graph-cache-shaped value: base64 payload in JSON, about ``size`` bytes."""
    return {"data": base64.b64encode(os.urandom(size * 3 // 4)).decode(), "time_taken_ms": 1200}


def _measure(n: int, value: dict[str, Any]) -> dict[str, float]:
    from torch._inductor.remote_cache import RemoteFxGraphCache

    cache = RemoteFxGraphCache("fx-graph-v1")
    cache.put("bench-key", value)
    assert cache.get("bench-key") == value
    get = cache.get
    _timed_calls(lambda: get("bench-key"), max(200, n // 10), batch=20)  # warm up
    samples = sorted(_timed_calls(lambda: get("bench-key"), n, batch=20))
    return {
        "median_us": statistics.median(samples) * 1e6,
        "p90_us": samples[int(len(samples) * 0.9)] * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=64 * 1024, help="value size in bytes")
    ap.add_argument("-n", type=int, default=5000, help="timed lookups per row")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median taken)")
    _results.add_arguments(ap)
    args = ap.parse_args()
    missing = redis_available()
    if missing:
        sys.exit(f"bench_inductor: {missing}")
    from torch._inductor import remote_cache

    from cuforge.integrations import inductor
    from cuforge.storage.urls import open_cache

    value = _value(args.size)
    samples: dict[str, list[dict[str, float]]] = {}
    with redis_server() as url, tempfile.TemporaryDirectory() as tmp:
        os.environ["TORCHINDUCTOR_REDIS_URL"] = url
        setups = {
            "stock redis (redis-py)": None,
            "cuforge redis": open_cache(url, secret=None),
            "cuforge redis, signed": open_cache(url, secret=SECRET),
            "cuforge file, signed": open_cache(os.path.join(tmp, "fs"), secret=SECRET),
        }
        # Interleaved rounds: a shared machine's load falls on every row alike.
        for _ in range(args.rounds):
            for label, cache in setups.items():
                if cache is None:
                    inductor.uninstall()
                else:
                    inductor.install(cache)
                samples.setdefault(label, []).append(_measure(args.n // args.rounds, value))
        inductor.uninstall()
        assert remote_cache.RemoteFxGraphCache.backend_override_cls is None
    rows = {
        label: {k: statistics.median(r[k] for r in runs) for k in ("median_us", "p90_us")}
        for label, runs in samples.items()
    }
    stock = rows["stock redis (redis-py)"]["median_us"]
    print(f"Inductor FX-graph remote cache get, {args.size} B value, {args.n} lookups")
    print(f"{'backend':<26}{'median us':>11}{'p90 us':>10}{'vs stock':>10}")
    for label, r in rows.items():
        ratio = r["median_us"] / stock
        print(f"{label:<26}{r['median_us']:>11.1f}{r['p90_us']:>10.1f}{ratio:>9.2f}x")
    _results.write(args.json, "inductor", {"size": args.size, "rows": rows}, note=args.note)


if __name__ == "__main__":
    main()
