"""The small client over a Redis Cluster (storage/redis/_cluster.py) against a real
3-primary cluster: a fresh process looks up, fills, waits and hits without importing
redis-py, every command reaching the primary that owns its slot; a slot migrating
(``ASK``) and moved (``MOVED``) under a client that read the map before; a slot no
primary serves is an outage the cache fails open on."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import pytest

from cuforge.storage import CacheReadWarning, CacheWriteWarning
from cuforge.storage.entry import key_digest
from cuforge.storage.redis import RedisProgramCache
from cuforge.storage.redis._cluster import ClusterClient, key_slot
from reliability._figures import record


def _fresh(code: str) -> list:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _owner(nodes: list, slot: int) -> int:
    """The index of the primary that owns ``slot``."""
    for i, node in enumerate(nodes):
        for row in node.execute_command("CLUSTER", "SLOTS"):
            if (
                int(row[0]) <= slot <= int(row[1])
                and int(row[2][1]) == node.connection_pool.connection_kwargs["port"]
            ):
                return i
    raise AssertionError(f"slot {slot} has no owner")


def test_key_slots_are_the_clusters(redis_cluster) -> None:
    node = redis_cluster.servers[0].client()
    for key in (b"a", b"cuforge:{00ff}", b"x{}y", b"{}", b"p:{tag}:lock", b"{a}{b}", b"\xff\x00"):
        assert key_slot(key) == node.execute_command("CLUSTER", "KEYSLOT", key), key


def test_a_fresh_process_fills_waits_and_hits_on_a_cluster_without_redis_py(
    redis_cluster,
) -> None:
    """With redis-py a cluster rank imported it (~100 ms), read the server's command
    table and spent 5-6 ms of CPU per kernel it waited for (docs/scaling.md)."""
    seen = _fresh(f"""
        import json, sys
        from cuforge.utils import open_cache
        c = open_cache({redis_cluster.url + "?prefix=fresh:"!r})
        with c.lock(b"k") as held:
            c[b"k"] = b"filled"
        keys = [b"k%d" % i for i in range(40)]
        for k in keys:
            c[k] = k + b" stored"
        ok = all(c.get(k) == k + b" stored" for k in keys)
        c.update({{b"u%d" % i: b"batch %d" % i for i in range(20)}})
        batch = all(c.get(b"u%d" % i) == b"batch %d" % i for i in range(20))
        filled = c.get(b"k").decode()
        stats = c.stats()
        c.close()  # flushes the counters
        print(json.dumps([held, filled, ok, batch, stats.read_failures,
                          stats.write_failures, "redis" in sys.modules]))
    """)
    assert seen == [True, "filled", True, True, 0, 0, False]
    nodes = [s.client() for s in redis_cluster.servers]
    held_by = [sum(1 for _ in n.scan_iter(match="fresh:{*}")) for n in nodes]
    assert sum(held_by) == 61 and all(held_by)  # spread over every primary
    fleet = {k.decode(): int(v) for k, v in nodes[_owner(nodes, key_slot(b"fresh:stats"))]
             .hgetall(b"fresh:stats").items()}  # fmt: skip
    assert fleet["stores"] == 61  # the counters reached the stats key's primary
    record(
        "herd", "redis cluster", "a fresh process fills under a lease, stores 61 entries "
        "and a batch over 3 primaries, reads them back", 61,
        "every entry on its slot's primary, read back whole; the counters on the stats "
        "key's primary; redis-py never imported", scale="all",
    )  # fmt: skip


def test_a_migrating_then_moved_slot_is_followed(redis_cluster) -> None:
    nodes = [s.client() for s in redis_cluster.servers]
    ids = [n.execute_command("CLUSTER", "MYID") for n in nodes]
    ports = [s.port for s in redis_cluster.servers]
    cache = RedisProgramCache(redis_cluster.url, prefix="mig:")
    try:
        assert isinstance(cache._redis._fast, ClusterClient)
        cache[b"k"] = b"before"
        assert cache.get(b"k") == b"before"  # the client has read the slot map
        name = cache._redis.name(key_digest(b"k"))
        slot = key_slot(name)
        src = _owner(nodes, slot)
        dst = (src + 1) % len(nodes)
        # ASK: the slot migrates and its key has gone to the new primary already.
        nodes[dst].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src])
        nodes[src].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst])
        nodes[src].execute_command("MIGRATE", "127.0.0.1", ports[dst], name, 0, 5000)
        in_slot = [n.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) for n in nodes]
        assert (in_slot[src], in_slot[dst]) == (0, 1)
        assert cache.get(b"k") == b"before"  # ASK, then ASKING + GET on the new primary
        # MOVED: the slot is the new primary's now; the client's map still says src.
        for node in nodes:
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[dst])
        assert cache.get(b"k") == b"before"
        cache[b"k"] = b"after"
        with cache.lock(b"k") as held:  # the lease script on the new primary
            assert held
        assert cache.get(b"k") == b"after"
        in_slot = [n.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) for n in nodes]
        assert (in_slot[src], in_slot[dst]) == (0, 2)  # the entry, the lease's notice
        stats = cache.stats()
        assert (stats.read_failures, stats.write_failures, stats.hits) == (0, 0, 4)
    finally:
        cache.close()
    record(
        "herd", "redis cluster", "a slot migrating (ASK), then moved (MOVED), under a client "
        "that read the slot map before", 2, "reads, a store and the lease followed to the "
        "new primary; 0 read or write failures", scale="all",
    )  # fmt: skip


def test_a_slot_no_primary_serves_is_an_outage_the_cache_fails_open_on(redis_cluster) -> None:
    nodes = [s.client() for s in redis_cluster.servers]
    cache = RedisProgramCache(redis_cluster.url, prefix="down:")
    try:
        cache[b"k"] = b"v"
        slot = key_slot(cache._redis.name(key_digest(b"k")))
        nodes[_owner(nodes, slot)].execute_command("CLUSTER", "DELSLOTS", slot)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert cache.get(b"k") is None  # CLUSTERDOWN: a miss, never an error
            cache[b"k"] = b"w"  # dropped
        assert cache.stats().read_failures == 1
        kinds = {w.category for w in caught}
        assert CacheReadWarning in kinds and not kinds - {CacheReadWarning, CacheWriteWarning}
        # an outage (backed off), not an answer the server gives every request
        assert any("CLUSTERDOWN" in str(w.message) and "retrying in" in str(w.message)
                   for w in caught), [str(w.message) for w in caught]  # fmt: skip
    finally:
        cache.close()
    record(
        "herd", "redis cluster", "the slot of a stored entry served by no primary "
        "(CLUSTER DELSLOTS)", 1, "a miss and a dropped store, one warning, backed off as an "
        "outage; no error reached the caller", scale="all",
    )  # fmt: skip


@pytest.mark.parametrize("url", ["rediss+cluster://127.0.0.1:1", "redis+cluster://h:1/2"])
def test_urls_the_small_client_does_not_serve_keep_redis_py(url: str) -> None:
    from cuforge.storage.redis._cluster import cluster_client_for_url

    assert cluster_client_for_url(url, {}, 0.5, 0.1) is None
    assert isinstance(cluster_client_for_url("redis+cluster://h:1", {}, 0.5, 0.1), ClusterClient)
