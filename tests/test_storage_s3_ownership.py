"""What an S3 cache may delete, and what its read-only commands may write: nothing.

A real SeaweedFS server (tests/_s3.py); each test has its own prefix in the one
bucket, which the tests fill with other programs' objects beside the cache's.
"""

from __future__ import annotations

import re
import uuid

import pytest

from _cli import run
from cuforge.storage.entry import entry_id
from cuforge.storage.s3 import _counters as _stats
from cuforge.utils import open_cache
from reliability._figures import record

obstore = pytest.importorskip("obstore")  # the [s3] extra (absent on the GPU machine)

HEX = "ab" * 32  # a well-formed entry id


def snapshot(raw, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix``: its bytes."""
    out = {}
    for page in obstore.list(raw, prefix=prefix):
        for meta in page:
            out[meta["path"]] = bytes(obstore.get(raw, meta["path"]).bytes())
    return out


def without_counters(objects: dict[str, bytes], prefix: str) -> dict[str, bytes]:
    """``objects`` less the cache's own counter objects (its stores are counted):
    ``<prefix>stats/<20 digits>-<12 hex>``."""
    own = re.compile(re.escape(prefix) + r"stats/[0-9]{20}-[0-9a-f]{12}")
    return {p: b for p, b in objects.items() if not own.fullmatch(p)}


def plant_foreign(raw, prefix: str) -> dict[str, bytes]:
    """Another program's objects in and beside the cache's folders."""
    objects = {
        f"{prefix}e/exp1/results.parquet": b"PAR1 results of experiment 1",
        f"{prefix}e/{HEX}.bak": b"CFS3 a backup copy is no entry",
        f"{prefix}e/{HEX.upper()}": b"upper-case hex is no entry name",
        f"{prefix}e/{HEX[:-1]}": b"63 digits is no entry name",
        f"{prefix}e/{HEX}/inside": b"a folder named like an entry",
        f"{prefix}notes.txt": b"remember the milk",
        f"{prefix}stats/README": b"not a counter object",
        f"{prefix}stats/00000000000000000001-zzzzzzzzzzzz": b"nearly a counter name",
        f"{prefix}locks/readme": b"not a lease",
        f"{prefix}eggs/{HEX}": b"beside e/",
    }
    for path, body in objects.items():
        obstore.put(raw, path, body)
    return objects


def test_clear_and_zero_stats_never_delete_another_programs_objects(s3_server, s3_url, tmp_path):
    """On ``s3://team-data/datasets`` clear() deleted every object under
    ``datasets/e/`` -- ``datasets/e/exp1/results.parquet`` too -- while ``stats`` said
    0 entries and ``ls`` listed nothing. Only objects at exact entry paths go."""
    raw = s3_server.raw()
    prefix = f"datasets-{uuid.uuid4().hex[:8]}/"
    url = s3_server.url(prefix=prefix.rstrip("/"))
    foreign = plant_foreign(raw, prefix)
    with open_cache(url, secret=None) as c:
        for i in range(3):
            c.set_entry(b"k%d" % i, b"payload %d" % i, b"meta")
        obstore.put(raw, f"{prefix}e/{'ef' * 32}", b"")  # an emptied entry: the cache's
        ids = sorted([entry_id(b"k%d" % i) for i in range(3)] + ["ef" * 32])
        assert sorted(e.id for e in c.iter_entries()) == ids and len(c) == 4
        c.clear()
        assert list(c.iter_entries()) == [] and len(c) == 0
        c.get(b"absent")  # a counter to flush, then reset
        c.zero_stats()
        c.zero_stats()
    assert without_counters(snapshot(raw, prefix), prefix) == foreign

    # the command line: the same rule, and it says it cleared
    with open_cache(url, secret=None) as c:
        for i in range(3):
            c.set_entry(b"k%d" % i, b"payload %d" % i, b"meta")
    env = s3_server.client_env(XDG_CACHE_HOME=str(tmp_path / "xdg"))
    result = run(tmp_path, "cache", "clear", "--yes", "--cache", url, env=env)
    assert result.returncode == 0, result.stderr
    with open_cache(url, secret=None) as c:
        assert len(c) == 0
    assert without_counters(snapshot(raw, prefix), prefix) == foreign
    record(
        "ownership", "s3",
        f"{len(foreign)} objects of other programs in and beside the prefix's folders "
        "(e/exp1/results.parquet, e/<id>.bak, near-entry names, stats/README, ...), "
        "then clear(), zero_stats() and cuforge cache clear --yes", 2,
        f"every one of the {len(foreign)} byte-identical; every entry and an emptied "
        "one removed", scale="all",
    )  # fmt: skip


def test_read_only_commands_create_nothing_and_writers_fold_the_counters(
    s3_server, s3_url, tmp_path, monkeypatch
):
    """``cache stats`` folded the counter objects when there were more than 64:
    a read-only command wrote an object, a lease, and deleted others. It writes
    nothing now; handles fold as they write their counters."""
    raw = s3_server.raw()
    # no handle folds while planting (raising=False: the knob is new)
    monkeypatch.setattr(_stats, "FOLD_ONE_IN", 10**9, raising=False)
    with open_cache(s3_url, secret=None) as c:
        c.set_entry(b"k", b"payload", b"meta")
        prefix = c.prefix
    for _ in range(70):  # 70 counter objects: past the fold threshold
        with open_cache(s3_url, secret=None) as h:
            h.get(b"absent")
    before = snapshot(raw, prefix)
    counters = [p for p in before if "/stats/" in p]
    assert len(counters) > 64  # what total_stats() folded at
    env = s3_server.client_env(XDG_CACHE_HOME=str(tmp_path / "xdg"))
    for args in (
        ("cache", "stats", "--json"),
        ("cache", "ls", "--json"),
        ("cache", "verify"),
        ("cache", "prune", "--older-than", "1ms", "--dry-run"),
    ):
        result = run(tmp_path, *args, "--cache", s3_url, env=env)
        assert result.returncode == 0, (args, result.stderr)
        assert snapshot(raw, prefix) == before, args  # nothing created, changed or deleted
    with open_cache(s3_url, secret=None) as c:
        assert c.total_stats().misses == 70
    assert snapshot(raw, prefix) == before  # total_stats() reads only

    # writers fold: with every close folding, the folder shrinks to one sum + the last
    monkeypatch.setattr(_stats, "FOLD_ONE_IN", 1, raising=False)
    with open_cache(s3_url, secret=None) as h:
        h.get(b"absent")
    after = [p for p in snapshot(raw, prefix) if "/stats/" in p]
    assert len(after) <= 2, after
    assert not any("/locks/" in p for p in snapshot(raw, prefix))  # the lease went
    with open_cache(s3_url, secret=None) as c:
        assert c.total_stats().misses == 71  # nothing lost, nothing counted twice
    record(
        "read-only", "s3",
        "cuforge cache stats, ls, verify and prune --dry-run with 70 counter objects "
        "(past the fold threshold)", 4,
        "no object created, changed or deleted; the next writer's close folded them "
        "into one, 71 misses counted once", scale="all",
    )  # fmt: skip
