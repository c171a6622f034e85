"""Limits: a length field damaged under an address-space limit, access times in the
future, values larger than the cap.

- A sidecar's payload length with one high bit flipped made ``get()`` allocate what
  it claimed (up to 4 GiB): a ``MemoryError`` out of ``get()`` under ``ulimit -v``, as
  on many HPC nodes. Reads are bounded by the file's size now: an integrity miss.
- Entries whose access time lies in the future (a host whose clock was ahead, a
  copied cache) outranked every other entry, and each new store was evicted by the
  eviction its own write started (20 of 20).
- A value larger than the cap evicted every other entry, then itself.

Real files, a real subprocess under ``RLIMIT_AS``; no sleeps: eviction order follows
the access times the test sets.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from _figures import SCALES, pick, record
from cuforge.storage import FileStreamProgramCache, InMemoryProgramCache, events
from cuforge.storage._integrity import SIDECAR_SIZE
from cuforge.storage.tiered import TieredProgramCache

_LIMITED_READER = r"""
import hashlib, json, resource, sys
limit = int(sys.argv[4])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # as `ulimit -v` would
from cuforge.storage import FileStreamProgramCache
root, keys, big = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
with FileStreamProgramCache(root) as cache:
    served = [cache.get(k) for k in keys]
    whole = cache.get(big)
    stats = cache.stats()
print(json.dumps({
    "served": sum(v is not None for v in served),
    "integrity_failures": stats.integrity_failures, "misses": stats.misses,
    "big": None if whole is None else hashlib.sha256(whole).hexdigest(),
}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux")
@SCALES
def test_a_flipped_length_bit_under_an_address_space_limit_is_an_integrity_miss(
    tmp_path: Path, scale: str
) -> None:
    """Bit 31 of a 4 KiB payload's length claims 2 GiB, bit 30 1 GiB: a 1 GiB address
    space could not allocate that (MemoryError out of get()). Every damaged entry is a
    miss, counted, removed; an intact 3 MiB entry (read past the unchecked bound) is
    served whole."""
    bits = pick(scale, [31, 30, 29, 28], list(range(20, 32)))
    per_bit = pick(scale, 1, 10)
    root = tmp_path / "cache"
    big = os.urandom(3 << 20)
    keys = []
    with FileStreamProgramCache(root) as cache:
        cache["big"] = big
        for bit in bits:
            for j in range(per_bit):
                key = f"b{bit}.{j}"
                cache[key] = os.urandom(4096)
                sidecar = Path(cache._loc(key).sidecar)
                side = bytearray(sidecar.read_bytes())
                side[8 + bit // 8] ^= 1 << (bit % 8)  # the u64 payload length at offset 8
                sidecar.write_bytes(bytes(side))
                keys.append(key)
    out = subprocess.run(
        [sys.executable, "-c", _LIMITED_READER, str(root), json.dumps(keys), "big",
         str(1 << 30)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout)
    n = len(keys)
    assert got["served"] == 0 and got["integrity_failures"] == n and got["misses"] == n, got
    assert got["big"] == hashlib.sha256(big).hexdigest()
    left = [p for p in (root / "entries").rglob("*") if p.is_file()]
    assert len(left) == 2, left  # the damaged pairs are gone; "big"'s pair stays
    record(
        "limits", "filestream",
        f"payload length bit {min(bits)}-{max(bits)} flipped; get() under a 1 GiB "
        "address-space limit (ulimit -v)", n,
        f"0 served, 0 exceptions; {n} integrity failures counted and {n} pairs removed; "
        "an intact 3 MiB entry served whole",
        scale=scale, lost=0,
    )  # fmt: skip


_DAY_NS = 86_400 * 10**9


def _stamp_atime(path: Path, atime_ns: int) -> None:
    os.utime(path, ns=(atime_ns, path.stat().st_mtime_ns))


@SCALES
def test_access_times_in_the_future_rank_as_now_and_a_new_store_stays(
    tmp_path: Path, scale: str
) -> None:
    """a, b, c read "a day from now" (a host whose clock was ahead), d a day ago; a
    store over the cap evicts two: d, then one of the future-stamped ones (ranked as
    now) -- never the new store, which went first before, in every run."""
    runs = pick(scale, 20, 200)
    entry = 1000 + SIDECAR_SIZE
    kept = 0
    for run in range(runs):
        with FileStreamProgramCache(tmp_path / str(run), max_size_bytes=4 * entry) as c:
            paths = {k: Path(c._loc(k).payload) for k in "abcde"}
            for k in "abcd":
                c[k] = k.encode() * 1000
            now = time.time_ns()
            for k in "abc":
                _stamp_atime(paths[k], now + _DAY_NS)
            _stamp_atime(paths["d"], now - _DAY_NS)
            c["e"] = b"e" * 1000  # over the cap: evicts down to 90%, two entries
            after = time.time_ns()
            gone = {k for k in "abcde" if not paths[k].exists()}
            assert "e" not in gone, f"run {run}: the new store was evicted by its own write"
            assert "d" in gone and len(gone) == 2 and c.stats().evictions == 2, gone
            kept += 1
            for k in set("abc") - gone:  # ranked as now, and they age from now on
                assert paths[k].stat().st_atime_ns <= after
                assert c.get(k) == k.encode() * 1000
            assert c.get("e") == b"e" * 1000
    # A hit restamps a future time too: it never waits for the file's time to pass.
    with FileStreamProgramCache(tmp_path / "hit") as c:
        c["k"] = b"v"
        path = Path(c._loc("k").payload)
        _stamp_atime(path, time.time_ns() + _DAY_NS)
    with FileStreamProgramCache(tmp_path / "hit") as fresh:
        assert fresh.get("k") == b"v"
        assert path.stat().st_atime_ns <= time.time_ns()
    record(
        "limits", "filestream",
        "access times a day in the future (a clock ahead, a copied cache), then a store "
        "over the cap", runs,
        f"the new store kept in {kept} of {runs} runs; evicted: the entry read a day ago, "
        "then a future-stamped one (ranked as now); the survivors' times set to now; a "
        "hit restamps a future time",
        scale=scale, lost=0,
    )  # fmt: skip


def _open(backend: str, root: Path, cap: int) -> Any:
    if backend == "memory":
        return InMemoryProgramCache(max_size_bytes=cap)
    if backend == "filestream":
        return FileStreamProgramCache(root, max_size_bytes=cap)
    return TieredProgramCache(
        InMemoryProgramCache(max_size_bytes=cap), FileStreamProgramCache(root, max_size_bytes=cap)
    )


@SCALES
@pytest.mark.parametrize("backend", ["memory", "filestream", "tiered"])
def test_a_value_larger_than_the_cap_is_refused_and_evicts_nothing(
    tmp_path: Path, backend: str, scale: str
) -> None:
    """Values larger than the cap are refused (``write_failures``, the drop reason
    ``too-large``) and evict nothing; a value whose stored size is the cap exactly is
    stored and kept (FileStream used to evict it after every other entry)."""
    n = pick(scale, 10, 100)
    cap = 64 << 10
    overhead = 0 if backend == "memory" else SIDECAR_SIZE  # a FileStream pair's sidecar
    small = {f"s{i}": os.urandom(4096) for i in range(8)}
    cache = _open(backend, tmp_path / "cache", cap)
    try:
        for k, v in small.items():
            cache[k] = v
        # From one byte over the cap up (a FileStream pair counts its sidecar; a tier
        # of both holds a value only while some level can)
        least = cap + 1 - (SIDECAR_SIZE if backend == "filestream" else 0)
        reasons = set()
        for i in range(n):
            events.take_dropped()
            cache[f"big{i}"] = os.urandom(least + i)
            dropped = events.take_dropped()
            reasons.add(None if dropped is None else dropped[0])
        stats = cache.stats()
        served = sum(cache.get(k) == v for k, v in small.items())
        assert reasons == {events.TOO_LARGE}
        assert all(cache.get(f"big{i}") is None for i in range(n))
        assert served == len(small) and stats.evictions == 0, stats
        assert stats.stores == len(small)
        levels = 2 if backend == "tiered" else 1
        assert stats.write_failures == levels * n, stats
        if backend != "memory":
            files = [p for p in (tmp_path / "cache" / "entries").rglob("*") if p.is_file()]
            assert sum(p.stat().st_size for p in files) == len(small) * (4096 + SIDECAR_SIZE)
            assert not list((tmp_path / "cache" / "tmp").glob("*.tmp"))
        edge = os.urandom(cap - overhead)  # exactly the cap: stored, and kept
        cache["edge"] = edge
        assert cache.get("edge") == edge
    finally:
        close = getattr(cache, "close", None)
        if close is not None:
            close()
    record(
        "limits", backend, "values larger than the cap (64 KiB) stored next to 8 entries",
        n,
        f"{n} of {n} refused (write_failures, reason too-large), 0 evictions, 8 of 8 "
        "entries served; a value of exactly the cap stored and kept",
        scale=scale, lost=0,
    )  # fmt: skip
