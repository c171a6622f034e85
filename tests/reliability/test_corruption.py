"""Corruption injection: damage 100% of the entries of a populated cache, one way at a
time, on every backend that keeps bytes outside the process. Every damaged entry must
be reported by the verifier, then looked up as a miss (counted), never served; a
compile through a cache whose every entry (objects and header manifests) is damaged
still returns the right code.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from _backends import FACTORIES
from _cache_workers import ARCH
from _figures import SCALES, pick, record
from _selfdesc import make, make_meta
from cuforge.compile import Program, ProgramOptions
from cuforge.storage import FileStreamProgramCache, entry_id
from cuforge.storage._integrity import SIDECAR_SUFFIX

# -- how each backend's raw bytes are reached ----------------------------------------------


class FileStreamRaw:
    """The payload and sidecar files of an entry, by key."""

    def __init__(self, cache: FileStreamProgramCache) -> None:
        self.cache = cache

    def paths(self, key: bytes) -> tuple[Path, Path]:
        payload = Path(self.cache._loc(key).payload)
        return payload, Path(str(payload) + SIDECAR_SUFFIX)

    def read(self, key: bytes, part: str) -> bytes:
        return self.paths(key)[part == "sidecar"].read_bytes()

    def write(self, key: bytes, part: str, data: bytes) -> None:
        self.paths(key)[part == "sidecar"].write_bytes(data)

    def delete(self, key: bytes, part: str) -> None:
        self.paths(key)[part == "sidecar"].unlink()


class RedisRaw:
    """The one Redis value of an entry, by key (``part`` is ignored)."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.client = cache._store.conn()

    def _name(self, key: bytes) -> bytes:
        from cuforge.storage.entry import key_digest

        return self.cache._store.name(key_digest(key))

    def read(self, key: bytes, part: str) -> bytes:
        return self.client.get(self._name(key))

    def write(self, key: bytes, part: str, data: bytes) -> None:
        self.client.set(self._name(key), data)

    def delete(self, key: bytes, part: str) -> None:
        self.client.delete(self._name(key))


class SQLiteRaw:
    """An entry's row, by key, through a connection of our own (as another program,
    or a disk, would change it)."""

    COLUMNS = {"payload": "data", "metadata": "meta", "digest": "crc", "key": "digest"}

    def __init__(self, cache: Any) -> None:
        import sqlite3

        self.conn = sqlite3.connect(cache.path, isolation_level=None)

    def _rid(self, key: bytes) -> int:
        from cuforge.storage.entry import key_digest
        from cuforge.storage.sqlite._schema import rid_of

        return rid_of(key_digest(key))

    def read(self, key: bytes, part: str) -> Any:
        column = self.COLUMNS.get(part, part)
        row = self.conn.execute(
            f"SELECT {column} FROM cuforge_entries WHERE rid = ?", (self._rid(key),)
        ).fetchone()
        return row[0]

    def write(self, key: bytes, part: str, data: Any) -> None:
        column = self.COLUMNS.get(part, part)
        self.conn.execute(
            f"UPDATE cuforge_entries SET {column} = ? WHERE rid = ?", (data, self._rid(key))
        )

    def delete(self, key: bytes, part: str) -> None:
        self.conn.execute("DELETE FROM cuforge_entries WHERE rid = ?", (self._rid(key),))

    def close(self) -> None:
        self.conn.close()


def flip(data: bytes, lo: int, hi: int, rng: random.Random) -> bytes:
    """``data`` with one random bit flipped in ``data[lo:hi]``."""
    out = bytearray(data)
    i = rng.randrange(lo, min(hi, len(out)))
    out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


Injection = Callable[[Any, bytes, bytes, random.Random], None]

# Sidecar: magic 0:4 | alg 4 | length 8:16 | CRC 16:20 | meta length 20:24 | key 24:56 | meta
FS_INJECTIONS: dict[str, Injection] = {
    "payload truncated": lambda r, k, o, g: r.write(k, "payload", r.read(k, "payload")[:-7]),
    "payload emptied": lambda r, k, o, g: r.write(k, "payload", b""),
    "payload zeroed": lambda r, k, o, g: r.write(k, "payload", bytes(len(r.read(k, "payload")))),
    "payload bit flipped": lambda r, k, o, g: r.write(
        k, "payload", flip(r.read(k, "payload"), 0, 1 << 30, g)
    ),
    "payload extended": lambda r, k, o, g: r.write(k, "payload", r.read(k, "payload") + b"\0"),
    "sidecar truncated": lambda r, k, o, g: r.write(k, "sidecar", r.read(k, "sidecar")[:30]),
    "digest bit flipped": lambda r, k, o, g: r.write(
        k, "sidecar", flip(r.read(k, "sidecar"), 16, 20, g)
    ),
    "length bit flipped": lambda r, k, o, g: r.write(
        k, "sidecar", flip(r.read(k, "sidecar"), 8, 16, g)
    ),
    "key digest bit flipped": lambda r, k, o, g: r.write(
        k, "sidecar", flip(r.read(k, "sidecar"), 24, 56, g)
    ),
    "metadata bit flipped": lambda r, k, o, g: r.write(
        k, "sidecar", flip(r.read(k, "sidecar"), 56, 1 << 30, g)
    ),
    "swapped with another entry": lambda r, k, o, g: _swap(r, k, o, ("payload", "sidecar")),
    "payload swapped with another's": lambda r, k, o, g: _swap(r, k, o, ("payload",)),
    "payload deleted": lambda r, k, o, g: r.delete(k, "payload"),
    "sidecar deleted": lambda r, k, o, g: r.delete(k, "sidecar"),
}

# Value: magic 0:4 | version 4 | alg 5 | stored_ns 8:16 | meta len 16:20 | payload len
# 20:28 | digest 28:44 | metadata (24 bytes here) | payload
REDIS_INJECTIONS: dict[str, Injection] = {
    "value truncated": lambda r, k, o, g: r.write(k, "", r.read(k, "")[:-7]),
    "value emptied": lambda r, k, o, g: r.write(k, "", b""),
    "payload zeroed": lambda r, k, o, g: r.write(
        k, "", r.read(k, "")[:68] + bytes(len(r.read(k, "")) - 68)
    ),
    "payload bit flipped": lambda r, k, o, g: r.write(k, "", flip(r.read(k, ""), 68, 1 << 30, g)),
    "digest bit flipped": lambda r, k, o, g: r.write(k, "", flip(r.read(k, ""), 28, 44, g)),
    "length bit flipped": lambda r, k, o, g: r.write(k, "", flip(r.read(k, ""), 20, 28, g)),
    "header bit flipped": lambda r, k, o, g: r.write(k, "", flip(r.read(k, ""), 0, 8, g)),
    "metadata bit flipped": lambda r, k, o, g: r.write(k, "", flip(r.read(k, ""), 44, 68, g)),
    "swapped with another entry": lambda r, k, o, g: _swap(r, k, o, ("",)),
    "value deleted": lambda r, k, o, g: r.delete(k, ""),
}


class S3Raw:
    """The one object of an S3 entry, by key (``part`` is ignored)."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def _path(self, key: bytes) -> str:
        return f"{self.cache.prefix}e/{entry_id(key)}"

    def read(self, key: bytes, part: str) -> bytes:
        import obstore

        return bytes(obstore.get(self.cache._store.store, self._path(key)).bytes())

    def write(self, key: bytes, part: str, data: bytes) -> None:
        import obstore

        obstore.put(self.cache._store.store, self._path(key), data)

    def delete(self, key: bytes, part: str) -> None:
        import obstore

        obstore.delete(self.cache._store.store, self._path(key))


# The S3 object has the Redis value's layout (magic CFS3, its own digest person).
S3_INJECTIONS: dict[str, Injection] = {
    how.replace("value", "object"): inject for how, inject in REDIS_INJECTIONS.items()
}

SQLITE_INJECTIONS: dict[str, Injection] = {
    "payload truncated": lambda r, k, o, g: r.write(k, "payload", r.read(k, "payload")[:-7]),
    "payload emptied": lambda r, k, o, g: r.write(k, "payload", b""),
    "payload zeroed": lambda r, k, o, g: r.write(k, "payload", bytes(len(r.read(k, "payload")))),
    "payload bit flipped": lambda r, k, o, g: r.write(
        k, "payload", flip(r.read(k, "payload"), 0, 1 << 30, g)
    ),
    "payload extended": lambda r, k, o, g: r.write(k, "payload", r.read(k, "payload") + b"\0"),
    "digest (crc) bit flipped": lambda r, k, o, g: r.write(
        k, "digest", r.read(k, "digest") ^ (1 << g.randrange(32))
    ),
    "key digest bit flipped": lambda r, k, o, g: r.write(
        k, "key", flip(r.read(k, "key"), 0, 32, g)
    ),
    "metadata bit flipped": lambda r, k, o, g: r.write(
        k, "metadata", flip(r.read(k, "metadata"), 0, 1 << 30, g)
    ),
    "payload and metadata swapped with another row's": lambda r, k, o, g: _swap(
        r, k, o, ("payload", "metadata", "digest")
    ),
    "payload swapped with another row's": lambda r, k, o, g: _swap(r, k, o, ("payload",)),
    "row deleted": lambda r, k, o, g: r.delete(k, ""),
}

DELETIONS = {"payload deleted", "sidecar deleted", "value deleted", "row deleted"}
DELETIONS |= {"object deleted"}


def _swap(raw: Any, key: bytes, other: bytes, parts: tuple[str, ...]) -> None:
    """Exchange ``parts`` of ``key`` and ``other`` (each pair is swapped once)."""
    if key > other:
        return
    for part in parts:
        a, b = raw.read(key, part), raw.read(other, part)
        raw.write(key, part, b)
        raw.write(other, part, a)


BACKENDS = {
    "filestream": (FileStreamRaw, FS_INJECTIONS),
    "redis": (RedisRaw, REDIS_INJECTIONS),
    "sqlite": (SQLiteRaw, SQLITE_INJECTIONS),
    "s3": (S3Raw, S3_INJECTIONS),
}


def _sqlite_listed_id(raw: Any, key: bytes) -> str:
    """A SQLite row is listed by its row id (the key digest's first 8 bytes, kept
    apart from the digest column) and the stored digest's other 24 bytes."""
    from cuforge.storage.entry import key_digest

    return (key_digest(key)[:8] + raw.read(key, "key")[8:]).hex()


#: Damage to the stored id itself: the verifier names such an entry by the id it is
#: listed under (the key's own id only where that can still be known).
LISTED_AS: dict[tuple[str, str], Callable[[Any, bytes], str]] = {
    ("sqlite", "key digest bit flipped"): _sqlite_listed_id,
}


def populate(cache: Any, n: int, rng: random.Random) -> list[bytes]:
    keys = [f"entry-{i}".encode() for i in range(n)]
    for key in keys:
        version = rng.randrange(1 << 30)
        cache.set_entry(key, make(key, version, rng.randrange(200, 5000)), make_meta(key, version))
    return keys


def cli_url(backend: str, cache: Any) -> str:
    """The cache URL the command line opens for ``cache``."""
    if backend == "filestream":
        return cache.path
    if backend == "sqlite":
        return f"sqlite://{cache.path}"
    return f"{cache._url}?prefix={cache.prefix}"


def cli_verify(tmp: Path, url: str) -> tuple[int, set[str]]:
    """``cuforge cache verify --json``: (entries checked, ids reported bad)."""
    import json

    from _cli import run

    done = run(tmp, "cache", "verify", "--cache", url, "--json")
    assert done.returncode in (0, 1), done.stderr  # 1: something is bad
    report = json.loads(done.stdout)
    assert (done.returncode == 1) == bool(report["bad"])
    return report["checked"], {b["id"] for b in report["bad"]}


def verify(cache: Any, keys: list[bytes]) -> tuple[int, int]:
    """What the verifier reports: (entries reported damaged, entries reported absent)."""
    damaged = absent = 0
    for key in keys:
        try:
            problem = cache.check_entry(entry_id(key))
        except KeyError:
            absent += 1
            continue
        assert problem, f"{key!r}: damaged entry verified as intact"
        damaged += 1
    return damaged, absent


@pytest.mark.parametrize("backend", list(BACKENDS))
@SCALES
def test_every_damaged_entry_is_detected_counted_and_never_served(
    backend: str, scale: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    raw_type, injections = BACKENDS[backend]
    n = pick(scale, 40, 1000)
    rng = random.Random(15)
    totals = {"injected": 0, "served": 0}
    for i, (how, inject) in enumerate(injections.items()):
        sub = tmp_path / f"k{i}"
        sub.mkdir()
        cache = FACTORIES[backend](sub, request)
        if backend == "redis":
            cache._store.conn().flushdb()
        if backend == "s3":
            cache.clear()  # one prefix per test: the previous injection's entries go
        try:
            keys = populate(cache, n, rng)
            raw = raw_type(cache)
            for j, key in enumerate(keys):
                inject(raw, key, keys[j ^ 1], rng)
            listed_as = LISTED_AS.get((backend, how), lambda raw, key: entry_id(key))
            ids = {listed_as(raw, key) for key in keys}
            if hasattr(raw, "close"):
                raw.close()
            damaged, absent = verify(cache, keys)
            url = request.getfixturevalue("s3_url") if backend == "s3" else cli_url(backend, cache)
            checked, reported = cli_verify(sub, url)
            if how in DELETIONS:
                assert (checked, reported) == (0, set()), how  # nothing left to list
            else:
                assert (checked, reported) == (n, ids), how  # each one, by its id
            before = cache.stats()
            served = sum(cache.get_entry(key) is not None for key in keys)
            served += sum(cache.get(key) is not None for key in keys)
            after = cache.stats()
            counted = after.integrity_failures - before.integrity_failures
            assert served == 0, how
            assert after.hits == before.hits, how
            assert after.misses - before.misses == 2 * n, how
            if how in DELETIONS:
                assert (damaged, absent, counted) == (0, n, 0), how  # a plain miss
            else:
                assert (damaged, absent) == (n, 0), how
                assert counted == n, how  # each found once, then removed: a plain miss
            # the cache recovers: every key can be stored and served again
            populate(cache, n, rng)
            assert all(cache.get_entry(key) is not None for key in keys), how
        finally:
            cache.close()
        totals["injected"] += n
        record(
            "corruption", backend, how, n,
            f"cuforge cache verify reported {len(reported)} of {n} (check_entry: {damaged} "
            f"damaged + {absent} absent); 0 served; "
            f"{counted} integrity failures counted; all {n} refilled",
            scale=scale, lost=0,
        )  # fmt: skip


def test_sqlite_verify_names_a_row_whose_key_digest_is_damaged(tmp_path: Path) -> None:
    from cuforge.storage import SQLiteProgramCache

    with SQLiteProgramCache(tmp_path / "c.db") as cache:
        keys = populate(cache, 16, random.Random(15))
        raw = SQLiteRaw(cache)
        for i, key in enumerate(keys):  # half in the row id's 8 bytes, half after them
            lo, hi = (0, 8) if i % 2 else (8, 32)
            raw.write(key, "key", flip(raw.read(key, "key"), lo, hi, random.Random(i)))
        listed_as = {key: _sqlite_listed_id(raw, key) for key in keys}
        expected = set(listed_as.values())
        raw.close()
        assert {entry_id(k) for k in keys[1::2]} <= expected  # first 8 bytes: the key's id
        listed = [e.id for e in cache.iter_entries()]
        assert sorted(listed) == sorted(expected)
        for eid in listed:  # each reported damaged by the id it is listed under
            assert "key digest" in cache.check_entry(eid)  # (as a possible cause)
            assert cache.read_entry(eid) is None
        for key in keys:  # ... and by its key's own id, never served
            assert cache.check_entry(entry_id(key))
            assert cache.read_entry(entry_id(key)) is None
        _, reported = cli_verify(tmp_path, f"sqlite://{cache.path}")
        assert reported == expected
        # removable by either id: half by the listed one, half by the key's own
        assert all(cache.remove_entry(listed_as[k]) for k in keys[::2])
        assert all(cache.remove_entry(entry_id(k)) for k in keys[1::2])
        assert len(cache) == 0 and list(cache.iter_entries()) == []
        assert cache.stats().integrity_failures == 0  # maintenance is not a lookup


def test_sqlite_verify_leaves_another_keys_intact_row_alone(tmp_path: Path) -> None:
    """An id whose first 8 bytes are another key's row id has no entry: that row,
    intact, is neither reported nor removed under it."""
    from cuforge.storage import SQLiteProgramCache

    with SQLiteProgramCache(tmp_path / "c.db") as cache:
        cache.set_entry(b"k", b"payload", b"meta")
        (own,) = [e.id for e in cache.iter_entries()]
        assert own == entry_id(b"k") and cache.check_entry(own) is None
        other = own[:16] + ("0" if own[16] != "0" else "1") + own[17:]
        with pytest.raises(KeyError):
            cache.check_entry(other)
        assert cache.read_entry(other) is None and not cache.remove_entry(other)
        assert cache.get(b"k") == b"payload"


def test_redis_verify_names_an_emptied_value(tmp_path: Path, request) -> None:
    cache = FACTORIES["redis"](tmp_path, request)
    try:
        keys = populate(cache, 4, random.Random(15))
        raw = RedisRaw(cache)
        for key in keys:
            raw.write(key, "", b"")
        ids = {entry_id(key) for key in keys}
        assert {e.id: e.size for e in cache.iter_entries()} == dict.fromkeys(ids, 0)
        for key in keys:
            assert "0 bytes" in cache.check_entry(entry_id(key))
            assert cache.read_entry(entry_id(key)) is None
        _, reported = cli_verify(tmp_path, cli_url("redis", cache))
        assert reported == ids
        from _cli import run

        fixed = run(tmp_path, "cache", "verify", "--fix", "--cache", cli_url("redis", cache))
        assert fixed.returncode == 1 and "4 removed" in fixed.stdout, fixed.stdout
        assert [raw.client.exists(raw._name(key)) for key in keys] == [0] * len(keys)
        assert cli_verify(tmp_path, cli_url("redis", cache)) == (0, set())
        assert all(cache.get_entry(key) is None for key in keys)
    finally:
        cache.close()


# -- a compile through a cache whose every entry is damaged ----------------------------------
HEADER_KERNEL = '#include "params_{i}.h"\nextern "C" __global__ void k(int* a) {{ *a = VALUE; }}\n'
PLAIN_KERNEL = 'extern "C" __global__ void k{i}(int* a) {{ *a = {i}; }}\n'


def _programs(tmp: Path, n: int) -> list[tuple[str, ProgramOptions]]:
    inc = tmp / "inc"
    inc.mkdir(exist_ok=True)
    out = []
    for i in range(n):
        (inc / f"params_{i}.h").write_text(f"#define VALUE {1000 + i}\n")
        out.append((HEADER_KERNEL.format(i=i), ProgramOptions(arch=ARCH, include_path=[inc])))
        out.append((PLAIN_KERNEL.format(i=i), ProgramOptions(arch=ARCH)))
    return out


def _rewrite(cache: Any, eid: str, data: bytes, meta: bytes) -> None:
    """Replace the entry ``eid`` with a well-framed one (a matching sidecar): what
    someone who can write the directory -- not an accident -- could do."""
    from cuforge.storage._integrity import key_seed, sidecar_for

    payload = Path(cache._driver.locate_id(eid).payload)
    kd = bytes.fromhex(eid)
    payload.write_bytes(data)
    Path(str(payload) + SIDECAR_SUFFIX).write_bytes(sidecar_for(kd, key_seed(kd), data, meta))


def _garble(cache: Any, how: str, rng: random.Random) -> tuple[int, int]:
    """Damage the entries of ``cache`` (found by listing it); return (objects, manifests)."""
    from cuforge.storage.record import decode_record

    inner = getattr(cache, "inner", cache)
    counts = [0, 0]
    for info in list(inner.iter_entries()):
        entry = inner.read_entry(info.id)
        assert entry is not None
        is_manifest = decode_record(entry.data, "manifest") is not None
        counts[is_manifest] += 1
        payload = Path(inner._driver.locate_id(info.id).payload)
        if how == "bit flipped":
            payload.write_bytes(flip(payload.read_bytes(), 0, 1 << 30, rng))
        elif how == "truncated":
            payload.write_bytes(payload.read_bytes()[:5])
        elif how == "manifests re-digested with garbage":
            if is_manifest:
                _rewrite(
                    inner,
                    info.id,
                    b'{"v":1,"kind":"manifest","x":' + os.urandom(8).hex().encode() + b"}",
                    b"",
                )
        else:  # every entry replaced and re-digested, signature envelope kept
            data = b"\x7fELF" + os.urandom(60)
            _rewrite(inner, info.id, data, entry.meta)
    return counts[0], counts[1]


GARBLINGS = {
    # how: (signed cache?, what the storage layer must count)
    "bit flipped": (False, "integrity_failures"),
    "truncated": (False, "integrity_failures"),
    "manifests re-digested with garbage": (False, None),
    "every entry re-digested (a forgery)": (True, "signature_failures"),
}


@SCALES
def test_compiles_through_a_fully_damaged_cache_return_the_right_code(tmp_path, scale) -> None:
    """Object entries and header manifests alike: damaged bytes are misses, a manifest
    that verifies but is garbage is refused by the compile layer, and forgeries that
    match the digest are refused by a signed cache. The code is always right.

    (A plain cache's digests guard against accidents, not against someone who can
    write the directory: a forged object entry with a recomputed digest is what
    signing is for, so that case runs on a signed cache.)"""
    from cuforge.storage import SignedProgramCache

    programs = _programs(tmp_path, pick(scale, 2, 12))
    reference = [Program(src, "c++", opts).compile("ptx").code for src, opts in programs]
    rng = random.Random(15)
    for how, (signed, counter) in GARBLINGS.items():
        root = tmp_path / how.split()[0]
        cache: Any = FileStreamProgramCache(root)
        if signed:
            cache = SignedProgramCache(cache, b"corruption-test-secret-0123456789")
        with cache:
            for src, opts in programs:
                Program(src, "c++", opts).compile("ptx", cache=cache)
            objects, manifests = _garble(cache, how, rng)
            assert objects == len(programs) and manifests == len(programs) // 2
            before = cache.stats()
            got = [Program(s, "c++", o).compile("ptx", cache=cache).code for s, o in programs]
            assert got == reference, how
            after = cache.stats()
            damaged = manifests if counter is None else objects + manifests
            if counter is not None:
                assert getattr(after, counter) - getattr(before, counter) >= len(programs), how
            if how != "manifests re-digested with garbage":
                assert after.hits == before.hits, how  # nothing damaged was served
            again = [Program(s, "c++", o).compile("ptx", cache=cache).code for s, o in programs]
            assert again == reference
            assert cache.stats().hits - after.hits >= len(programs)  # refilled and hit
        record(
            "corruption", "signed-filestream" if signed else "filestream",
            f"compile cache: {how} (object entries and header manifests)", damaged,
            f"{len(programs)} compiles returned the uncached code; 0 damaged entries used; "
            f"{counter or 'manifest refused by its decoder'}; the next compiles hit",
            scale=scale, lost=0,
        )  # fmt: skip


@pytest.mark.parametrize(
    "how",
    [
        "file truncated to half",
        "header zeroed but its application id",
        "pages overwritten with garbage",
    ],
)
@SCALES
def test_a_damaged_sqlite_file_is_moved_aside_and_never_served(tmp_path, how, scale) -> None:
    # Every damage here leaves cuforge's application id in the header: the proof
    # that lets the cache move the file aside (without it: the test below).
    import warnings

    from cuforge.storage import CacheRecoveryWarning, SQLiteProgramCache

    n = pick(scale, 40, 1000)
    db = tmp_path / "c.db"
    with SQLiteProgramCache(db) as cache:
        keys = populate(cache, n, random.Random(15))
    data = bytearray(db.read_bytes())
    if how == "file truncated to half":
        data = data[: len(data) // 2]
    elif how == "header zeroed but its application id":
        data[16:68] = bytes(52)  # the magic (0-16) and the id (68-72) stay
        data[72:100] = bytes(28)
    else:
        rng = random.Random(15)
        for page in range(1, len(data) // 4096):
            data[page * 4096 + 8 : page * 4096 + 4096] = rng.randbytes(4088)
    db.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = SQLiteProgramCache(db)
        with cache:
            served = sum(cache.get_entry(key) is not None for key in keys)
            served += sum(cache.get(key) is not None for key in keys)
            populate(cache, n, random.Random(16))  # and it works again
            assert all(cache.get_entry(key) is not None for key in keys)
    notices = [str(w.message) for w in caught if issubclass(w.category, CacheRecoveryWarning)]
    assert served == 0
    assert len(notices) == 1, notices
    aside = [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    moved = "moved it to" in notices[0]
    assert moved == bool(aside), (notices, aside)
    record(
        "corruption", "sqlite", f"database {how} (every entry)", n,
        f"0 served; 1 CacheRecoveryWarning; file {'moved aside, ' if moved else ''}"
        f"cache usable again ({n} refilled)",
        scale=scale, lost=0,
    )  # fmt: skip


@pytest.mark.parametrize("how", ["header zeroed", "file zero-filled"])
@SCALES
def test_a_sqlite_file_no_longer_provably_ours_is_refused_untouched(tmp_path, how, scale) -> None:
    """Damage that takes the application id with it leaves nothing that proves the
    file is cuforge's -- a user's file looks the same, and a lock file beside it
    proves nothing -- so opening refuses it, one line naming the path and the fix,
    and neither renames nor creates anything."""
    from cuforge.storage import CachePathError, SQLiteProgramCache

    n = pick(scale, 40, 1000)
    db = tmp_path / "c.db"
    with SQLiteProgramCache(db) as cache:
        populate(cache, n, random.Random(15))
    data = bytearray(db.read_bytes())
    if how == "header zeroed":
        data[:100] = bytes(100)
    else:
        data = bytearray(len(data))
    db.write_bytes(bytes(data))
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(CachePathError) as info:
        SQLiteProgramCache(db)
    message = str(info.value)
    assert str(db) in message and "is not a cuforge SQLite cache" in message
    assert "\n" not in message and "path of its own" in message
    assert db.read_bytes() == bytes(data)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    record(
        "corruption", "sqlite", f"database {how} (every entry)", n,
        "0 served; refused with one line naming the path and the fix (not provably "
        "cuforge's: no application id); file left byte for byte, nothing created or renamed",
        scale=scale, lost=0,
    )  # fmt: skip
