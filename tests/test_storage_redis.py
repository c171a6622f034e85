"""RedisProgramCache against real redis-server processes on loopback ports.

Every test starts its own server (fixtures in conftest.py); failure tests kill it
or stop it with SIGSTOP. Timeouts are short so the suite stays fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from _cache_workers import ARCH, SRC
from _redis import RedisServer
from cuforge.compile import Program, ProgramOptions, _nvrtc
from cuforge.storage import CacheReadWarning, CacheWriteWarning, entry_id
from cuforge.storage._breaker import CircuitBreaker
from cuforge.storage.outcome import Damaged
from cuforge.storage.redis import RedisProgramCache
from cuforge.storage.stats import CacheStats
from cuforge.utils import make_program_cache_key, open_cache

WORKERS = os.path.join(os.path.dirname(__file__), "_cache_workers.py")
posix_only = pytest.mark.skipif(os.name == "nt", reason="POSIX signals")


def name_of(key: bytes, prefix: str = "cuforge:") -> bytes:
    return f"{prefix}{{{entry_id(key)}}}".encode()


def src_key() -> bytes:
    return make_program_cache_key(
        code=SRC, code_type="c++", options=ProgramOptions(arch=ARCH), target_type="cubin"
    )


@pytest.fixture
def compiles(monkeypatch):
    """Counts real NVRTC compiles in this process."""
    real = _nvrtc.compile_cpp
    count = [0]

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(_nvrtc, "compile_cpp", counted)
    return count


def worker(command: str, **args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, WORKERS, command, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out)


# -- layout and integrity ---------------------------------------------------------------
def test_an_entry_is_one_hash_tagged_value_with_header_digest_meta_payload(redis_server):
    with RedisProgramCache(redis_server.url) as c:
        c.set_entry(b"k", b"payload", b"meta")
    raw = redis_server.client()
    assert sorted(raw.keys("*")) == [b"cuforge:stats", name_of(b"k")]  # stats flushed at close
    value = raw.get(name_of(b"k"))
    assert value[:4] == b"CFRE" and value[4] == 1
    assert value[44:] == b"metapayload"  # metadata first, then the raw payload


def _damage(raw, name: bytes, how: str) -> None:
    value = bytearray(raw.get(name))
    if how == "payload bit":
        value[-1] ^= 0x10
    elif how == "metadata bit":
        value[45] ^= 0x01
    elif how == "truncated":
        del value[-3:]
    elif how == "empty":
        value = bytearray()
    elif how == "not ours":
        value = bytearray(b'{"some": "json"}')
    raw.set(name, bytes(value))


@pytest.mark.parametrize(
    "how", ["payload bit", "metadata bit", "truncated", "empty", "not ours", "other key"]
)
def test_damaged_values_are_misses_counted_and_removed(redis_server, how):
    raw = redis_server.client()
    with RedisProgramCache(redis_server.url) as c:
        c.set_entry(b"k", b"payload" * 10, b"meta")
        c.set_entry(b"other", b"another payload", b"")
        if how == "other key":  # a valid value under the wrong name
            raw.set(name_of(b"k"), raw.get(name_of(b"other")))
        else:
            _damage(raw, name_of(b"k"), how)
        assert c.check_entry(entry_id(b"k")) is not None  # names the problem
        assert c.read_entry(entry_id(b"k")) is None
        assert c.get_entry(b"k") is None
        s = c.stats()
        assert (s.integrity_failures, s.misses, s.hits) == (1, 1, 0)
        assert raw.get(name_of(b"k")) is None  # removed
        assert c.get(b"other") == b"another payload"


def test_a_damaged_value_replaced_meanwhile_is_not_removed(redis_server):
    raw = redis_server.client()
    with RedisProgramCache(redis_server.url) as c:
        c[b"k"] = b"old"
        stale = raw.get(name_of(b"k"))
        time.sleep(0.001)
        c[b"k"] = b"new"  # a writer replaced it after the reader fetched `stale`
        c._driver.drop(c._loc(b"k"), Damaged("stale", (stale, None)))
        assert c.get(b"k") == b"new"


def test_prefixes_isolate_caches_on_one_server(redis_server):
    with (
        RedisProgramCache(redis_server.url, prefix="a:") as a,
        RedisProgramCache(redis_server.url, prefix="b:") as b,
    ):
        a[b"k"] = b"from a"
        b[b"k"] = b"from b"
        b[b"only-b"] = b"x"
        assert (a[b"k"], b[b"k"], len(a), len(b)) == (b"from a", b"from b", 1, 2)
        a.clear()
        assert a.get(b"k") is None and len(b) == 2


# -- TTL ------------------------------------------------------------------------------------
def test_ttl_is_set_on_store_and_refreshed_by_a_hit(redis_server):
    raw = redis_server.client()
    with RedisProgramCache(redis_server.url, ttl=2.0) as c:
        c[b"hot"] = b"v"
        assert 1800 < raw.pttl(name_of(b"hot")) <= 2000
        time.sleep(0.5)
        assert raw.pttl(name_of(b"hot")) <= 1600
        assert c.get(b"hot") == b"v"
        assert raw.pttl(name_of(b"hot")) > 1800  # the hit renewed it
    with RedisProgramCache(redis_server.url, prefix="short:", ttl=0.2) as c:
        c[b"cold"] = b"v"
        time.sleep(0.4)
        assert c.get(b"cold") is None  # expired: never read within its TTL
    with RedisProgramCache(redis_server.url, prefix="forever:") as c:
        c[b"k"] = b"v"
        assert raw.pttl(name_of(b"k", "forever:")) == -1


def test_a_hit_is_one_command(redis_server):
    raw = redis_server.client()
    with RedisProgramCache(redis_server.url, ttl=60) as c:
        c[b"k"] = b"v"
        c.get(b"k")  # connects
        raw.config_resetstat()
        for _ in range(20):
            assert c.get(b"k") == b"v"
        calls = {
            name: stat["calls"]
            for name, stat in raw.info("commandstats").items()
            if not name.startswith("cmdstat_config")
        }
        assert calls == {"cmdstat_getex": 20}


def test_update_stores_many_entries(redis_server):
    with RedisProgramCache(redis_server.url, ttl=60) as c:
        c.update({f"k{i}": bytes([i]) * 10 for i in range(50)})
        assert len(c) == 50 and c.get("k7") == b"\x07" * 10
        assert c.stats().stores == 50


# -- failing open ---------------------------------------------------------------------------
def _caught(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    cache_warnings = (CacheReadWarning, CacheWriteWarning)
    return result, [w for w in caught if issubclass(w.category, cache_warnings)]


@posix_only
def test_a_killed_server_turns_into_misses_and_counted_failures(redis_server, compiles):
    c = RedisProgramCache(redis_server.url, timeout=0.3, connect_timeout=0.3, retry_after=60)
    c[b"k"] = b"v"
    assert c.get(b"k") == b"v"
    redis_server.kill()

    def use() -> tuple[float, bool, object]:
        t0 = time.monotonic()
        got = c.get(b"k")
        c[b"k2"] = b"v2"
        with c.lock(b"k3") as held:
            pass
        obj = Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=c)
        return time.monotonic() - t0, held, (got, obj)

    (elapsed, held, (got, obj)), caught = _caught(use)
    assert got is None and held is False
    assert obj.code == Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin").code
    assert compiles[0] == 2  # compiled through the dead cache, then once more for reference
    assert len(caught) == 1 and "Compiles are not affected" in str(caught[0].message)
    # the first failure was a lookup: a read warning, at this file's line (c.get above)
    assert caught[0].category is CacheReadWarning and caught[0].filename == __file__
    assert elapsed < 5  # one connection failure, then skipped (the compile is most of it)
    s = c.stats()
    assert s.read_failures >= 3 and s.write_failures == 2 and s.hits == 1
    c.close()  # closing with the server gone raises nothing


@posix_only
def test_a_hung_server_costs_one_timeout_then_backs_off(redis_server):
    c = RedisProgramCache(redis_server.url, timeout=0.2, retry_after=0.5)
    c[b"k"] = b"v"
    assert c.get(b"k") == b"v"
    redis_server.pause()  # SIGSTOP: connections are accepted, nothing answers
    try:
        t0 = time.monotonic()
        (got, caught) = _caught(lambda: c.get(b"k"))
        first = time.monotonic() - t0
        assert got is None and len(caught) == 1 and "TimeoutError" in str(caught[0].message)
        assert caught[0].category is CacheReadWarning and caught[0].filename == __file__
        assert 0.15 < first < 1.5
        t0 = time.monotonic()
        for i in range(50):
            assert c.get(b"k") is None
            c[b"x%d" % i] = b"v"
        with c.lock(b"k") as held:
            assert held is False
        assert time.monotonic() - t0 < 0.2  # backing off: no timeout paid per call
        s = c.stats()
        assert (s.read_failures, s.write_failures, s.misses) == (51, 50, 51)
    finally:
        redis_server.resume()
    time.sleep(0.6)  # past retry_after: the next call probes and succeeds
    assert c.get(b"k") == b"v"
    c[b"after"] = b"ok"
    assert c.get(b"after") == b"ok"
    c.close()


def test_circuit_breaker_backs_off_exponentially_and_recovers():
    b = CircuitBreaker(retry_after=0.05, max_retry_after=0.15)
    assert b.allow() and not b.is_open
    assert b.failure() == 0.05
    assert b.is_open and not b.allow()
    time.sleep(0.06)
    assert b.allow()  # the probe
    assert not b.allow()  # everyone else keeps skipping while it runs
    assert b.failure() == 0.1  # the probe failed: twice as long
    time.sleep(0.11)
    assert b.allow()
    assert b.failure() == 0.15  # capped
    time.sleep(0.16)
    assert b.allow()
    b.success()
    assert b.allow() and b.allow() and not b.is_open
    assert b.failure() == 0.05  # back to the start after a success


@posix_only
def test_a_restarted_server_is_used_again_after_the_back_off(redis_server, tmp_path):
    c = RedisProgramCache(redis_server.url, timeout=0.3, connect_timeout=0.3, retry_after=0.3)
    c[b"k"] = b"v"
    port = redis_server.port
    redis_server.kill()
    _caught(lambda: c.get(b"k"))
    assert c.stats().read_failures == 1
    restarted = RedisServer(tmp_path / "again", port=port)
    try:
        time.sleep(0.35)
        assert c.get(b"k") is None  # a fresh server: empty, but reachable
        c[b"k"] = b"v2"
        assert c.get(b"k") == b"v2"
    finally:
        c.close()
        restarted.stop()


def test_a_read_only_replica_serves_hits_and_counts_refused_writes(redis_server, tmp_path):
    redis_server.client().config_set("repl-diskless-sync-delay", 0)  # default: wait 5 s
    replica = RedisServer(tmp_path / "replica", "--replicaof", "127.0.0.1", str(redis_server.port))
    try:
        with RedisProgramCache(redis_server.url) as primary:
            primary[b"k"] = b"from the primary"
        reader = RedisProgramCache(replica.url, ttl=60)  # a replica refuses GETEX
        deadline = time.monotonic() + 10
        while reader.get(b"k") is None:
            assert time.monotonic() < deadline, "replication did not catch up"
            time.sleep(0.02)
        _, caught = _caught(lambda: reader.__setitem__(b"new", b"v"))
        # The server's refusal, as the store's client reports it (the small client's
        # ReplyError since stores go through it: "READONLY You can't write ...").
        assert len(caught) == 1 and "write against a read only replica" in str(caught[0].message)
        assert reader.stats().write_failures == 1
        assert reader.get(b"k") == b"from the primary"  # an error answer is no outage
        reader.close()
    finally:
        replica.stop()


# -- single-flight ------------------------------------------------------------------------
def test_four_processes_missing_one_key_compile_once(redis_server, tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    counter = tmp_path / "compiles"
    procs = [
        worker(
            "compile_url",
            url=redis_server.url,
            counter=str(counter),
            barrier=str(barrier),
            parties=4,
        )
        for _ in range(4)
    ]
    results = [finish(p) for p in procs]
    assert len(counter.read_text().splitlines()) == 1
    assert len({r["sha256"][0] for r in results}) == 1
    with RedisProgramCache(redis_server.url) as c:
        t = c.total_stats()
    assert (t.stores, t.misses, t.hits) == (1, 1, 3)


def test_a_waiter_stops_as_soon_as_the_entry_is_stored(redis_server):
    holder = RedisProgramCache(redis_server.url)
    waiter = RedisProgramCache(redis_server.url)
    stored = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with holder.lock(b"k") as held:
            assert held
            holder[b"k"] = b"compiled"
            stored.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    stored.wait(5)
    t0 = time.monotonic()
    with waiter.lock(b"k", timeout=5) as held:
        assert held is False  # not the lock: the result, which is there
        assert waiter.get(b"k") == b"compiled"
    assert time.monotonic() - t0 < 0.5
    release.set()
    t.join()
    holder.close()
    waiter.close()


def test_the_lock_is_released_only_by_its_owner(redis_server):
    raw = redis_server.client()
    lock_name = name_of(b"k") + b":lock"
    with RedisProgramCache(redis_server.url) as c:
        with c.lock(b"k") as held:
            assert held and raw.get(lock_name)
        assert raw.get(lock_name) is None  # released
        with c.lock(b"k") as held:
            raw.set(lock_name, b"someone-else")  # ours expired and was taken
        assert raw.get(lock_name) == b"someone-else"


@posix_only
def test_a_live_holder_renews_its_lease_and_a_killed_one_frees_waiters(redis_server, tmp_path):
    ready = tmp_path / "ready"
    holder = worker("redis_hold", url=redis_server.url, lease=0.3, ready=str(ready))
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() or not ready.read_text():
            assert time.monotonic() < deadline and holder.poll() is None
            time.sleep(0.01)
        assert ready.read_text() == "held"
        with RedisProgramCache(redis_server.url) as c:
            t0 = time.monotonic()
            with c.lock(src_key(), timeout=1.0) as held:
                assert held is False  # 3+ leases: the holder kept renewing
            assert time.monotonic() - t0 >= 0.95
            holder.send_signal(signal.SIGKILL)
            holder.wait()
            t0 = time.monotonic()
            with c.lock(src_key(), timeout=5) as held:
                assert held  # the lease ran out
            assert time.monotonic() - t0 < 1.0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


# -- fleet statistics -----------------------------------------------------------------------
def test_fleet_stats_sum_over_processes_and_show_in_the_cli(redis_server):
    a = worker("redis_traffic", url=redis_server.url, hits=10, misses=5)
    b = worker("redis_traffic", url=redis_server.url, hits=20, misses=3)
    finish(a), finish(b)
    with RedisProgramCache(redis_server.url) as c:
        t = c.total_stats()
    assert (t.hits, t.misses, t.stores, t.bytes_read) == (30, 8, 2, 3000)
    out = subprocess.run(
        [sys.executable, "-m", "cuforge", "cache", "stats", "--cache", redis_server.url, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(out.stdout)
    assert (report["hits"], report["misses"], report["entries"]) == (30, 8, 1)
    assert report["hit_rate"] == round(30 / 38, 4)


def test_counters_are_flushed_at_exit_and_not_inherited_by_a_fork(redis_server):
    finish(worker("redis_traffic", url=redis_server.url, hits=7, misses=2, close=False))
    with RedisProgramCache(redis_server.url) as c:
        assert (c.total_stats().hits, c.total_stats().misses) == (7, 2)
    parent = RedisProgramCache(redis_server.url, prefix="fork:")
    for _ in range(5):
        parent.get(b"absent")
    pid = os.fork()
    if pid == 0:  # the child counts its own lookups only
        code = 1
        try:
            parent.get(b"absent-in-child")
            parent.close()
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    parent.close()
    with RedisProgramCache(redis_server.url, prefix="fork:") as c:
        assert c.total_stats().misses == 6


def test_live_handles_flush_every_few_operations(redis_server):
    with (
        RedisProgramCache(redis_server.url, stats_every=4) as busy,
        RedisProgramCache(redis_server.url) as reader,
    ):
        for _ in range(8):
            busy.get(b"absent")
        assert reader.total_stats().misses == 8  # without closing `busy`


def test_zero_stats_restarts_the_fleet_counters_for_every_handle(redis_server):
    finish(worker("redis_traffic", url=redis_server.url, hits=10, misses=5))  # another process
    with (
        RedisProgramCache(redis_server.url, stats_every=4) as live,
        RedisProgramCache(redis_server.url, stats_every=1000) as resetter,
        RedisProgramCache(redis_server.url, prefix="other:") as other,
    ):
        for _ in range(8):  # flushed twice by now
            live.get(b"absent")
        for _ in range(3):  # flushed by zero_stats itself, then reset with the rest
            resetter.get(b"absent")
        other.get(b"absent")
        assert other.total_stats().misses == 1
        assert live.total_stats().misses == 5 + 8  # resetter's 3 are not flushed yet
        resetter.zero_stats()
        assert resetter.total_stats() == CacheStats()  # every host's, every counter
        assert redis_server.client().exists(b"cuforge:stats") == 0
        assert resetter.stats().misses == 3  # the handle's own counters stay
        assert other.total_stats().misses == 1  # another prefix is another fleet
        for _ in range(4):  # counted once after the reset, not again from before it
            live.get(b"absent")
        resetter.get(b"present")
        t = resetter.total_stats()
        assert (t.misses, t.hits, t.bytes_read) == (4, 1, 100)
    with RedisProgramCache(redis_server.url) as c:
        assert (c.total_stats().misses, c.total_stats().hits) == (4, 1)  # closes added nothing
    with RedisProgramCache(redis_server.url, read_only=True) as ro:
        with pytest.raises(PermissionError, match="read-only"):
            ro.zero_stats()
        assert ro.total_stats().misses == 4


def test_maintenance_on_a_dead_server_raises_connectionerror(redis_server):
    c = RedisProgramCache(redis_server.url, timeout=0.2, connect_timeout=0.2)
    redis_server.kill()
    calls = (lambda: len(c), c.clear, c.total_stats, c.zero_stats, lambda: list(c.iter_entries()))
    for call in calls:
        with pytest.raises(ConnectionError, match=r"Redis cache 127\.0\.0\.1"):
            call()
    c.close()


# -- Redis Cluster --------------------------------------------------------------------------
def test_cluster_spreads_entries_keeps_each_entry_on_one_shard_and_locks(redis_cluster, tmp_path):
    with open_cache(redis_cluster.url) as c:
        assert c.cluster
        for i in range(60):
            c.set_entry(b"k%d" % i, b"v%d" % i, b"m")
        assert len(c) == 60 and c.get_entry(b"k7").data == b"v7"
        nodes = [s.client() for s in redis_cluster.servers]
        assert all(n.dbsize() > 0 for n in nodes)  # every shard holds some
        name = name_of(b"k7")
        assert nodes[0].cluster("keyslot", name) == nodes[0].cluster("keyslot", name + b":lock")
        with c.lock(b"k7") as held:
            assert held
        assert len(list(c.iter_entries())) == 60
        assert c.check_entry(entry_id(b"k7")) is None
        assert c.total_stats().stores == 60
        c.zero_stats()  # the fleet hash lives on one shard
        assert c.total_stats() == CacheStats()
        c.update({b"u1": b"1", b"u2": b"2"})
        assert c.get(b"u2") == b"2"
        c.clear()
        assert len(c) == 0
    port = redis_cluster.servers[1].port
    with open_cache(f"redis://127.0.0.1:{port}?cluster=1") as c:
        assert c.cluster
        c[b"x"] = b"y"
        assert c[b"x"] == b"y"
    # Single-flight through the cluster (in the same test: a cluster takes 2 s to start).
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    counter = tmp_path / "compiles"
    procs = [
        worker(
            "compile_url",
            url=redis_cluster.url,
            counter=str(counter),
            barrier=str(barrier),
            parties=3,
        )
        for _ in range(3)
    ]
    for p in procs:
        finish(p)
    assert len(counter.read_text().splitlines()) == 1


# -- TLS --------------------------------------------------------------------------------------
def _make_certs(d: Path) -> None:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=cuforge-test-ca")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key",
            "-out", "server.csr", "-subj", "/CN=127.0.0.1")  # fmt: skip
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2",
            "-extfile", "ext.cnf")  # fmt: skip


@pytest.mark.skipif(not any(
    os.access(os.path.join(p, "openssl"), os.X_OK) for p in os.environ.get("PATH", "").split(":")
), reason="needs the openssl command")  # fmt: skip
def test_rediss_talks_tls_and_verifies_the_server(tmp_path):
    _make_certs(tmp_path)
    from _redis import free_port

    port = free_port()
    server = RedisServer(
        tmp_path / "tls",
        "--tls-cert-file", str(tmp_path / "server.pem"),
        "--tls-key-file", str(tmp_path / "server.key"),
        "--tls-ca-cert-file", str(tmp_path / "ca.pem"),
        "--tls-auth-clients", "no",
        port=port, tls=True,
    )  # fmt: skip
    try:
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={tmp_path / 'ca.pem'}&timeout=1s"
        with open_cache(url) as c:
            c[b"k"] = b"over tls"
            assert c[b"k"] == b"over tls"
        # Without the CA the server's certificate does not verify: a miss, never a hit.
        with open_cache(f"rediss://127.0.0.1:{port}/0?timeout=1s") as c:
            got, caught = _caught(lambda: c.get(b"k"))
            assert got is None and len(caught) == 1 and caught[0].category is CacheReadWarning
    finally:
        server.stop()


def test_listing_reads_metadata_larger_than_its_first_read(redis_server):
    meta = b"m" * 10_000
    with RedisProgramCache(redis_server.url) as c:
        c.set_entry(b"k", b"payload", meta)
        (info,) = list(c.iter_entries())
        assert info.meta == meta and info.size == 44 + len(meta) + len(b"payload")


def test_a_read_only_handle_never_writes_to_the_server(redis_server):
    raw = redis_server.client()
    with RedisProgramCache(redis_server.url, ttl=60) as writer:
        writer[b"k"] = b"v"
    raw.delete(b"cuforge:stats")
    raw.persist(name_of(b"k"))
    with open_cache(redis_server.url + "?ro&ttl=1h") as tier:
        (ro,) = tier.levels
        assert ro.read_only and tier.read_only == (0,)
        assert tier.get(b"k") == b"v"
        assert raw.pttl(name_of(b"k")) == -1  # no TTL renewal
        tier[b"new"] = b"not stored"
        ro[b"new"] = b"not stored either"
        with tier.lock(b"new") as held, ro.lock(b"new") as held_too:
            assert held and held_too  # this process's threads only
        _damage(raw, name_of(b"k"), "payload bit")
        assert ro.get(b"k") is None and ro.stats().integrity_failures == 1
        for call in (ro.clear, lambda: ro.remove_entry(entry_id(b"k"))):
            with pytest.raises(PermissionError, match="read-only"):
                call()
    assert sorted(raw.keys("*")) == [name_of(b"k")]  # damaged value kept, nothing added


def test_constructor_errors_name_the_argument(redis_server):
    with pytest.raises(ValueError, match="url_or_client: 'h:1' is not a Redis URL"):
        RedisProgramCache("http://user:pw@h:1")
    with pytest.raises(TypeError, match="url_or_client must be"):
        RedisProgramCache(None)
    for bad in ({"ttl": 0}, {"timeout": -1}, {"prefix": ""}, {"lock_lease": "1s"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RedisProgramCache(redis_server.url, **bad)
    with RedisProgramCache(redis_server.client()) as c:  # a ready client
        c[b"k"] = b"v"
        assert c[b"k"] == b"v" and not c.cluster


def test_a_failed_lookup_through_the_python_api_is_a_read_warning_at_the_callers_line():
    """A Redis lookup failure was a CacheWriteWarning pointing into cuforge's own code;
    it is a CacheReadWarning naming the line that called compile (stacklevel)."""
    import inspect

    from _redis import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: connections are refused
    with RedisProgramCache(url, connect_timeout=0.2, retry_after=60) as cache:
        program = Program(SRC, "c++", ProgramOptions(arch=ARCH))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            line = inspect.currentframe().f_lineno + 1
            obj = program.compile("cubin", cache=cache)
        assert obj.code[:4] == b"\x7fELF"  # the compile is never failed by the cache
        (warning,) = [w for w in caught if issubclass(w.category, RuntimeWarning)]
        assert warning.category is CacheReadWarning, warning
        assert (warning.filename, warning.lineno) == (__file__, line)
        stats = cache.stats()
        assert stats.read_failures >= 1 and stats.write_failures >= 1  # store skipped, no warning


def test_a_refused_password_is_not_said_to_be_a_server_that_is_down(redis_server):
    """A server that is up and refuses the URL's password: the warning said the fleet's
    counters get the handle's counts "only if it answers again" -- it answers, and
    refuses them too. Now it says they are kept only if it accepts them, and it does not."""
    url = redis_server.url.replace("redis://", "redis://:pw@")
    with RedisProgramCache(url, retry_after=60) as c:

        def use() -> bytes | None:
            got = c.get(b"k")
            c[b"k"] = b"v"  # a dropped store, counted without a second warning
            return got

        got, caught = _caught(use)
        assert got is None and c.stats().read_failures == 1 and c.stats().write_failures == 1
    (warning,) = caught
    text = str(warning.message)
    assert "the server answered with an error" in text and "answers again" not in text, text
    assert "only if it accepts them before the handle is closed: while it refuses them" in text
    assert redis_server.client().dbsize() == 0  # as said: no count reached the server
