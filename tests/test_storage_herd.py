"""The herd (issue 35) at CI scale: a dozen real client processes cold-start on the
same real kernels through a tier ``file://<host dir>,<fleet server>`` against a real
redis-server, a Redis Cluster of 3 masters made by ``redis-cli --cluster create``,
and SeaweedFS (S3). Each client counts every request it sends to the server
(``tests/_herd.py``); no timing is asserted (``benchmarks/bench_herd.py`` measures
it, docs/scaling.md has the numbers).

- every kernel is compiled exactly once in the herd, every client gets the bytes a
  lone compile makes;
- a waiter costs O(1) requests per kernel: at most 3 per client per kernel on Redis
  and on a cluster (take, blocking wait, read), at most 6 on S3;
- ranks of one host send the fleet no more than one rank does (one waiter per host);
- a holder SIGKILLed in the middle of its compile is replaced by exactly one new
  holder: the kernel is compiled twice in all;
- on a cluster an entry's lease and notices live in its slot;
- the lock file a waiter blocks on in the kernel is let go when it gives up.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import _herd
from _redis import RedisCluster
from cuforge.compile import Program, ProgramOptions
from cuforge.storage import lease
from cuforge.storage._filelock import try_lock, unlock, wait_lock
from cuforge.utils import open_cache
from reliability._figures import record

pytestmark = pytest.mark.skipif(os.name == "nt", reason="POSIX processes and file locks")

KERNELS = 2
UNROLL = 8


@pytest.fixture(scope="module")
def reference() -> dict[int, str]:
    """The sha256 of each kernel's cubin, compiled alone without a cache."""
    return {
        k: hashlib.sha256(
            Program(_herd.kernel_source(k, UNROLL), "c++", ProgramOptions(arch=_herd.ARCH))
            .compile("cubin")
            .code
        ).hexdigest()
        for k in range(KERNELS)
    }


def herd(tmp_path: Path, fleet: str, clients: int, per_host: int = 1, **kw) -> _herd.Herd:
    return _herd.run(
        tmp_path / "herd",
        lambda host: f"file://{tmp_path}/herd/host{host},{fleet}",
        clients, per_host, KERNELS, UNROLL, s3=fleet.startswith("s3://"), **kw,
    )  # fmt: skip


def warm_scripts(tmp_path: Path, server_url: str) -> None:
    """One lone client first, on a prefix of its own: the server (each node of a
    cluster that owns a kernel's slot) has seen the lease scripts, as every server
    has after its first compile. A script's first use costs one more round trip
    (EVALSHA answers NOSCRIPT, then EVAL), which the herd must not show."""
    _herd.run(
        tmp_path / "lone", lambda _: f"file://{tmp_path}/lone/host,{server_url}?prefix=lone:",
        1, 1, KERNELS, UNROLL, s3=False,
    )  # fmt: skip


def check_bytes(got: _herd.Herd, reference: dict[int, str]) -> None:
    for result in got.results:
        assert {int(k): v for k, v in result["shas"].items()} == reference


def sent(got: _herd.Herd, command: str) -> int:
    return sum(r["sent"].get(command, 0) for r in got.results)


def served(nodes) -> tuple[dict[str, dict[str, int]], Callable[[str], None]]:
    """A ``mark`` for the harness that records, at the herd's start and end, how many
    EVALSHA and BLMOVE calls the servers served (scripts never make these calls)."""
    seen: dict[str, dict[str, int]] = {}

    def mark(when: str) -> None:
        stats = [node.info("commandstats") for node in nodes]
        seen[when] = {
            c: sum(int(s.get(f"cmdstat_{c}", {}).get("calls", 0)) for s in stats)
            for c in ("evalsha", "blmove")
        }

    return seen, mark


def check_served(seen: dict[str, dict[str, int]], got: _herd.Herd) -> None:
    """The client-side count saw every script call and wait the servers served."""
    for command in ("evalsha", "blmove"):
        assert seen["all"][command] - seen["go"][command] == sent(got, command) > 0


def test_a_redis_herd_compiles_each_kernel_once_at_three_requests_a_kernel(
    redis_server, tmp_path, reference
) -> None:
    clients = 12
    warm_scripts(tmp_path, redis_server.url)
    seen, mark = served([redis_server.client()])
    got = herd(tmp_path, redis_server.url + "?prefix=herd:", clients, mark=mark)
    assert len(got.finished()) == KERNELS, got.compiles
    assert {c[1] for c in got.finished()} == set(range(KERNELS))
    check_bytes(got, reference)
    # Waiters block on the holder's notice: take, wait, read -- no polling.
    assert got.requests() <= 3 * clients * KERNELS, got.results
    check_served(seen, got)
    record(
        "herd", "redis", f"{clients} processes x {KERNELS} kernels cold at once, 1 per host "
        "(file://<host>,redis://)", clients * KERNELS,
        f"{len(got.finished())} compiles, 0 wrong bytes; {got.requests()} requests = "
        f"{got.requests() / (clients * KERNELS):.2f} per client per kernel (polling: 609)",
        scale="all",
    )  # fmt: skip


def test_ranks_of_one_host_send_the_fleet_what_one_rank_does(
    redis_server, tmp_path, reference
) -> None:
    clients, per_host = 12, 4
    warm_scripts(tmp_path, redis_server.url)
    got = herd(tmp_path, redis_server.url + "?prefix=hosts:", clients, per_host)
    assert len(got.finished()) == KERNELS
    check_bytes(got, reference)
    for host in range(clients // per_host):
        ranks = [r for r in got.results if r["host"] == host]
        assert len(ranks) == per_host
        assert got.requests(host) <= 3 * KERNELS, ranks
        # The other ranks of the host waited on the local lock and read the local level.
        assert sum(1 for r in ranks if _herd.work_requests(r["sent"]) == 0) >= per_host - KERNELS
    hosts = clients // per_host
    record(
        "herd", "redis", f"{clients} processes x {KERNELS} kernels cold, {per_host} per host",
        clients * KERNELS,
        f"{len(got.finished())} compiles, 0 wrong bytes; "
        f"{got.requests() / (hosts * KERNELS):.2f} fleet requests per host per kernel "
        "(one waiter per host; polling: 216 for one host)", scale="all",
    )  # fmt: skip


def test_signed_ranks_of_one_host_also_send_the_fleet_what_one_rank_does(
    redis_server, tmp_path, reference
) -> None:
    # With CUFORGE_CACHE_SECRET every persistent level is signed (SignedProgramCache):
    # the local level is still the host's lock, the fleet's wait still hands over.
    clients, per_host = 8, 4
    warm_scripts(tmp_path, redis_server.url)
    env = dict(os.environ, CUFORGE_CACHE_SECRET="herd-test-" + "ab" * 16)
    got = herd(tmp_path, redis_server.url + "?prefix=signed:", clients, per_host, env=env)
    assert len(got.finished()) == KERNELS, got.compiles
    check_bytes(got, reference)
    for host in range(clients // per_host):
        assert got.requests(host) <= 3 * KERNELS, [r for r in got.results if r["host"] == host]
    for r in got.results:
        assert r["stats"]["signature_failures"] == 0
    raw = redis_server.client()
    values = [raw.get(name) for name in raw.scan_iter(match="signed:{*}")]
    assert len(values) == KERNELS and all(b"CFSG" in v[:200] for v in values)


def test_a_herd_on_a_redis_cluster_made_by_redis_cli(tmp_path, reference) -> None:
    cluster = RedisCluster(tmp_path / "cluster", via_cli=True)
    try:
        clients = 8
        warm_scripts(tmp_path, cluster.url)
        nodes = [s.client() for s in cluster.servers]
        seen, mark = served(nodes)
        got = herd(tmp_path, cluster.url + "?prefix=herd:", clients, mark=mark)
        assert len(got.finished()) == KERNELS, got.compiles
        check_bytes(got, reference)
        assert got.requests() <= 3 * clients * KERNELS, got.results
        check_served(seen, got)
        # Each entry's keys (the entry, and the notices its holder left) live on one node.
        where: dict[bytes, set[int]] = {}
        for i, node in enumerate(nodes):
            for name in node.scan_iter(match="herd:*"):
                if b"{" in name:
                    tag = name.split(b"{", 1)[1].split(b"}", 1)[0]
                    where.setdefault(tag, set()).add(i)
        assert len(where) == KERNELS
        for tag, found in where.items():
            assert len(found) == 1, (tag, found)
            keys = [k for k in nodes[found.pop()].scan_iter(match=b"*{" + tag + b"}*")]
            assert any(b":done:" in k for k in keys), keys
            slots = {nodes[0].execute_command("CLUSTER", "KEYSLOT", k) for k in keys}
            assert len(slots) == 1
        record(
            "herd", "redis cluster", f"{clients} processes x {KERNELS} kernels cold at once on "
            "3 masters made by redis-cli --cluster create", clients * KERNELS,
            f"{len(got.finished())} compiles, 0 wrong bytes; "
            f"{got.requests() / (clients * KERNELS):.2f} requests per client per kernel "
            "(polling: 337 in all); each entry's keys on one node", scale="all",
        )  # fmt: skip
    finally:
        cluster.stop()


def test_an_s3_herd_compiles_each_kernel_once_at_six_requests_a_kernel(
    s3_server, tmp_path, reference
) -> None:
    clients = 8
    got = herd(tmp_path, s3_server.url(), clients, env=s3_server.client_env())
    assert len(got.finished()) == KERNELS, got.compiles
    check_bytes(got, reference)
    assert got.requests() <= 6 * clients * KERNELS, got.results
    record(
        "herd", "s3", f"{clients} processes x {KERNELS} kernels cold at once, 1 per host "
        "(file://<host>,s3://, SeaweedFS)", clients * KERNELS,
        f"{len(got.finished())} compiles, 0 wrong bytes; "
        f"{got.requests() / (clients * KERNELS):.2f} requests per client per kernel "
        "(polling: 289 in all)", scale="all",
    )  # fmt: skip


@pytest.mark.parametrize("fleet", ["redis", "s3"])
def test_a_holder_killed_mid_compile_is_replaced_once(fleet, request, tmp_path, reference) -> None:
    lease_s = 1.0 if fleet == "redis" else 2.0
    if fleet == "redis":
        server = request.getfixturevalue("redis_server")
        url, env = server.url + f"?prefix=kill:&lock_lease={lease_s:g}s", None
    else:
        server = request.getfixturevalue("s3_server")
        url, env = server.url(lock_lease=f"{lease_s:g}s"), server.client_env()
    got = herd(tmp_path, url, 6, per_host=2, victim=0, env=env)
    victims = [c for c in got.compiles if c[3] is None]
    assert len(victims) == 1 and victims[0][0] == got.victim_pid
    # The killed holder's compile and exactly one more of its kernel; one of the other.
    assert sorted(c[1] for c in got.finished()) == list(range(KERNELS))
    assert len(got.compiles) == KERNELS + 1
    assert len(got.results) == 5
    check_bytes(got, reference)
    assert got.t_kill is not None
    again = min(c[2] for c in got.finished() if c[1] == 0) - got.t_kill
    record(
        "herd", fleet, f"the holder of a kernel SIGKILLed 0.3 s into its compile, 6 processes "
        f"2 per host, lock_lease {lease_s:g} s", 1,
        f"{len(got.compiles)} compiles of {KERNELS} kernels (the killed one's and one "
        f"more); 0 wrong bytes; the replacement started {again:.2f} s after the kill",
        scale="all",
    )  # fmt: skip


# -- the pieces ---------------------------------------------------------------------------
def test_an_entry_a_wait_hands_over_is_served_only_when_its_signature_verifies(
    redis_server, tmp_path
) -> None:
    url = redis_server.url + "?prefix=forged:"
    with open_cache(url, secret="another-fleet-" + "cd" * 16) as other:
        other[b"k"] = b"planted under another secret"
    tier = open_cache(f"file://{tmp_path}/host,{url}", secret="this-fleet-" + "ab" * 16)
    try:
        assert tier.get_entry(b"k", count_miss=False) is None  # the host level only
        with tier.lock(b"k") as held:  # the fleet's claim reads the entry: refused
            assert held is False
            assert tier.get_entry(b"k") is None  # the look-again (counted, as a compile's)
        stats = tier.stats()
        assert (stats.signature_failures, stats.misses, stats.hits) == (1, 1, 0)
        local = open_cache(f"file://{tmp_path}/host", secret=None)
        assert local.get(b"k") is None  # nothing was written to the host's level
        local.close()
        tier[b"k"] = b"ours"  # a fill under this secret replaces it
        assert tier.get(b"k") == b"ours"
    finally:
        tier.close()


def test_an_entry_the_fleet_hands_over_counts_one_hit_where_it_was_found(
    redis_server, tmp_path
) -> None:
    url = redis_server.url + "?prefix=counted:"
    with open_cache(url, secret=None) as peer:
        peer[b"k"] = b"from the fleet"
    tier = open_cache(f"file://{tmp_path}/host,{url}", secret=None)
    try:
        assert tier.get_entry(b"k", count_miss=False) is None  # the host level only
        with tier.lock(b"k") as held:  # the claim reads it from the fleet: handed over
            assert held is False
            assert tier.get(b"k") == b"from the fleet"  # the look-again, from the host's level
        local, fleet = tier.level_stats()
        # it was not there when asked: a miss at the host's level (the request reached
        # it), the hit where it was found; the request counts one hit in all
        assert (local.hits, local.misses) == (0, 1)
        assert (fleet.hits, fleet.misses) == (1, 0)
        assert (tier.stats().hits, tier.stats().misses) == (1, 0)
        # a fill counts one miss at each level, the claim's level included
        with tier.lock(b"new") as held:
            assert held is True and tier.get(b"new") is None
            tier[b"new"] = b"filled"
        local, fleet = tier.level_stats()
        assert (local.misses, fleet.misses, tier.stats().misses) == (2, 1, 1)
    finally:
        tier.close()


def test_a_host_waiter_whose_holder_stored_the_entry_takes_it_without_the_lock(
    tmp_path,
) -> None:
    """The ranks of a host that waited for one holder took its lock in turn, each
    making a lock file of its own (the holder deletes its file), only to read the
    entry under it. A waiter whose holder finished now reads the entry at once and
    holds nothing (``lock`` yields False, as after a hand-over from the fleet); one
    whose holder stored nothing takes the lock. Counted as before: one hit at the
    host's level."""
    url = f"file://{tmp_path}/host,file://{tmp_path}/fleet"
    holder, waiter = open_cache(url, secret=None), open_cache(url, secret=None)
    locks = tmp_path / "host" / "locks"
    try:
        for key, stored in ((b"k", True), (b"failed", False)):
            assert waiter.get_entry(key, count_miss=False) is None
            got: list[tuple[bool, bytes | None]] = []

            def wait(key: bytes = key, got: list[tuple[bool, bytes | None]] = got) -> None:
                with waiter.lock(key) as held:
                    entry = waiter.get_entry(key)  # the look-again
                    got.append((held, None if entry is None else entry.data))

            with holder.lock(key) as held:
                assert held
                thread = threading.Thread(target=wait)
                thread.start()
                thread.join(0.2)
                assert thread.is_alive() and not got  # blocked on the host's lock
                if stored:
                    holder[key] = b"compiled"
            thread.join(30)
            assert got == ([(False, b"compiled")] if stored else [(True, None)])
            assert not list(locks.iterdir())  # no lock file left behind
        host, fleet = waiter.level_stats()
        assert (host.hits, host.misses, fleet.hits) == (1, 1, 0)
        assert (waiter.stats().hits, waiter.stats().misses) == (1, 1)
    finally:
        holder.close()
        waiter.close()
    record(
        "herd", "filestream", "a rank waits on its host's lock while the host's holder "
        "stores the entry; another while the holder stores nothing", 2,
        "the first took the stored entry without the lock (held False), no lock file "
        "left; the second took the lock; one hit and one miss at the host's level", scale="all",
    )  # fmt: skip


def test_a_host_waiters_hand_over_counts_a_miss_at_the_memory_level_in_front(tmp_path) -> None:
    """The request's first lookup asked the memory level and the host's level (each
    miss left to the look-again); the host's claim handed the entry over (its hit).
    The look-again, quiet after a hand-over, counted no miss at the memory level
    either, which the request reached and which did not have the entry."""
    url = f"memory://,file://{tmp_path}/host,file://{tmp_path}/fleet"
    holder, waiter = open_cache(url, secret=None), open_cache(url, secret=None)
    try:
        assert waiter.get_entry(b"k", count_miss=False) is None
        got: list[tuple[bool, bytes | None]] = []

        def wait() -> None:
            with waiter.lock(b"k") as held:
                entry = waiter.get_entry(b"k")  # the look-again
                got.append((held, None if entry is None else entry.data))

        with holder.lock(b"k") as held:
            assert held
            thread = threading.Thread(target=wait)
            thread.start()
            thread.join(0.2)
            assert thread.is_alive() and not got  # blocked on the host's lock
            holder[b"k"] = b"compiled"
        thread.join(30)
        assert got == [(False, b"compiled")]  # handed over by the host's claim
        memory, host, fleet = waiter.level_stats()
        assert (memory.hits, memory.misses) == (0, 1)
        assert (host.hits, host.misses, fleet.hits, fleet.misses) == (1, 0, 0, 0)
        assert (waiter.stats().hits, waiter.stats().misses) == (1, 0)
    finally:
        holder.close()
        waiter.close()


def test_a_host_waiter_whose_holder_stored_a_foreign_entry_takes_the_lock(tmp_path) -> None:
    """A signed host level hands a waiter over only an entry that verifies: one its
    host's holder stored under another secret is refused, and the waiter then takes
    the lock (as a waiter did before the hand-over) and goes on to the fleet, rather
    than compiling unlocked."""
    url = f"file://{tmp_path}/host,file://{tmp_path}/fleet"
    holder = open_cache(url, secret="another-host-" + "cd" * 16)
    waiter = open_cache(url, secret="this-host-" + "ab" * 16)
    try:
        got: list[tuple[bool, bytes | None]] = []

        def wait() -> None:
            with waiter.lock(b"k") as held:
                got.append((held, waiter.get(b"k")))

        with holder.lock(b"k") as held:
            assert held
            thread = threading.Thread(target=wait)
            thread.start()
            thread.join(0.2)
            assert thread.is_alive() and not got
            holder[b"k"] = b"signed under another secret"
        thread.join(30)
        assert got == [(True, None)]  # it holds the lock to fill; the entry never served
        assert waiter.stats().signature_failures >= 1
    finally:
        holder.close()
        waiter.close()
    record(
        "herd", "filestream (signed)", "a host's holder stores an entry signed under another "
        "secret while a rank waits on the host's lock", 1, "the entry was refused, never "
        "served; the waiter took the lock (to fill) instead of compiling unlocked", scale="all",
    )  # fmt: skip


def test_a_waiter_that_gave_up_lets_go_of_the_lock_it_gets_later(tmp_path) -> None:
    path = tmp_path / "k.lock"
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    assert try_lock(holder)
    waiter = os.open(path, os.O_RDWR)
    assert not wait_lock(waiter, 0.05)  # given up; its helper thread still blocks
    unlock(holder)
    # The helper gets the lock now and, its caller gone, closes it: it is free again.
    third = os.open(path, os.O_RDWR)
    try:
        assert lease_free(third), "the helper of a waiter that gave up kept the lock"
    finally:
        os.close(third)
        os.close(holder)


def lease_free(fd: int) -> bool:
    """Whether ``fd``'s lock can be had (waiting for it without polling, bounded)."""
    if not wait_lock(fd, 30):
        return False
    unlock(fd)
    return True


def test_a_blocked_waiter_takes_the_lock_when_its_holder_lets_go(tmp_path) -> None:
    path = tmp_path / "k.lock"
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    assert try_lock(holder)
    waiter = os.open(path, os.O_RDWR)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(wait_lock(waiter, None)))
    thread.start()
    thread.join(0.1)
    assert thread.is_alive() and not got  # blocked while the holder holds
    unlock(holder)
    thread.join(30)
    assert got == [True]
    other = os.open(path, os.O_RDWR)
    try:
        assert not try_lock(other)  # the waiter holds it now
    finally:
        os.close(other)
        unlock(waiter)
        os.close(waiter)
        os.close(holder)


def test_waits_reuse_their_blocking_thread(tmp_path, monkeypatch) -> None:
    """A thread started for every wait cost a waiter 90-200 us of CPU per kernel; the
    thread that blocked for one wait serves the next."""
    started: list[str] = []
    start = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        started.append(self.name)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    path = tmp_path / "k.lock"
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        for _ in range(5):
            assert try_lock(holder)
            waiter = os.open(path, os.O_RDWR)
            release = threading.Timer(0.05, unlock, (holder,))
            release.start()
            assert wait_lock(waiter, 30)  # blocked until the holder let go
            unlock(waiter)
            os.close(waiter)
            release.join()
    finally:
        os.close(holder)
    assert started.count("cuforge-file-lock") <= 1
    record(
        "herd", "filestream", "waits in a row on a file lock its holder holds", 5,
        f"{started.count('cuforge-file-lock')} blocking thread started (one per wait before)",
        scale="all",
    )  # fmt: skip


def test_a_forked_child_waits_with_threads_of_its_own(tmp_path) -> None:
    """The blocking threads a process keeps do not exist in a child it forks: the
    child's wait must not be handed to one of them (it would never answer)."""
    path = tmp_path / "k.lock"
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    first = os.open(path, os.O_RDWR)
    assert lease_free(first)  # this process now keeps a thread
    os.close(first)
    assert try_lock(holder)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait for the parent to let go
        code = 1
        try:
            os.close(read)
            waiter = os.open(path, os.O_RDWR)
            os.write(write, b"w")
            code = 0 if wait_lock(waiter, 30) else 2
        finally:
            os._exit(code)
    os.close(write)
    try:
        assert os.read(read, 1) == b"w"
        unlock(holder)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(read)
        os.close(holder)
    record(
        "herd", "filestream", "a forked child waits on a lock after its parent kept a "
        "blocking thread", 1, "the child got the lock when its parent let go", scale="all",
    )  # fmt: skip


def test_s3_checks_follow_the_hint_and_never_stop_for_longer_than_most() -> None:
    lease._random.seed(1)
    for expect, fill, most in [(1.0, 1.0, 100.0), (0.5, 8.0, 100.0), (1.0, 60.0, 7.5)]:
        schedule = lease.Backoff(0.0, expect, most)
        now, checks, last = 0.0, 0, 0.0
        while now < fill:
            at = schedule.next(now)
            assert at > now and at - last <= most * 1.2 + 1e-9
            last = now = at
            checks += 1
        # One check when the hint is right; a few doublings when it is low.
        if fill <= expect * 1.2:
            assert checks <= 2
        assert checks <= 2 + math.log2(2 * fill / expect) + fill / most, (expect, fill, checks)
        # Never a fast poll: the first check is a hint after the start.
        assert lease.Backoff(0.0, expect, most).next(0.0) >= expect


def test_expiry_jitter_is_a_small_share_of_the_lease() -> None:
    values = [lease.expiry_jitter(30.0) for _ in range(200)]
    assert all(0 <= v <= lease.MAX_EXPIRY_JITTER_S for v in values)
    assert len(set(values)) > 100  # processes that wake together spread out
    assert all(0 <= lease.expiry_jitter(1.0) <= 0.05 for _ in range(50))
