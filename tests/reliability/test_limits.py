"""Limits: a length field damaged under an address-space limit, values larger than
the cap.

- A sidecar's payload length with one high bit flipped made ``get()`` allocate what
  it claimed (up to 4 GiB): a ``MemoryError`` out of ``get()`` under ``ulimit -v``, as
  on many HPC nodes. Reads are bounded by the file's size now: an integrity miss.
- A value larger than the cap evicted every other entry, then itself.

Real files, a real subprocess under ``RLIMIT_AS``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
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
                sidecar = Path(cache._names_for(key).sidecar)
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
    ``too-large``) and evict nothing."""
    n = pick(scale, 10, 100)
    cap = 64 << 10
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
    finally:
        close = getattr(cache, "close", None)
        if close is not None:
            close()
    record(
        "limits", backend, "values larger than the cap (64 KiB) stored next to 8 entries",
        n,
        f"{n} of {n} refused (write_failures, reason too-large), 0 evictions, 8 of 8 "
        "entries served",
        scale=scale, lost=0,
    )  # fmt: skip
