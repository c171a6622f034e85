"""Warm-set prefetch against one bulk transfer of the same bytes, and against one get
after another, from a real redis-server and a real SeaweedFS S3 on loopback.

    python benchmarks/bench_warmset.py [--entries 1000] [--size 32768] [--rounds 5]
        [--only redis|s3] [--local file|sqlite] [--rtt MS] [--dir DIR] [--keep]

Each round, for each backend: N entries of SIZE random bytes (recorded as cuforge
programs: a kind a pack holds) are in the shared cache and a warm set lists them,
published as a job that ended well publishes it: with its pack (``warmpacks``: the
entries as chunks of ~8 MiB in the shared cache). The ways to bring them into an
empty local level, one after another in each round (so a noisy moment hits them
alike):

- ``bulk``: the same N x SIZE bytes as ONE value/object (a Redis GET by cuforge's
  own small client, an S3 GET by obstore), written to one local file -- the floor a
  tarball-style restore cannot beat;
- ``floor``: the N entries' bytes written into an empty directory as the FileStream
  layout's files (payload and sidecar, in shard directories), with no fetch and no
  check -- what any per-entry local cache pays this file system (``--local file``);
- ``prefetch``: ``cuforge.integrations.warmsets.prefetch`` through the tier
  ``<local>,<shared>`` with the set's pack (the set loaded first, included in the
  time): the pack's chunks, then nothing else;
- ``per key``: the same prefetch without the pack (what it did before packs: batches
  of 64 keys, each level asked once per batch);
- ``one by one``: ``get_entry`` of each key in turn through the same kind of tier
  (what a job without a warm set does as it asks).

``--rtt MS`` puts a relay that holds each chunk back MS/2 each way in front of the
servers (``_delay.py``): a network's round trip instead of loopback's. Prints each
configuration's median (and best) over the rounds and the ratios of medians
``prefetch / bulk`` (goal <= 2), ``one by one / prefetch`` (goal >= 10),
``per key / bulk`` and ``prefetch / floor``; then the CPU each way cost this process
(user + system, all its threads: ``getrusage``) and the server (``/proc/PID/stat``;
the relays not counted), medians in milliseconds.

Every directory a run writes (the servers', each way's local level) is under
``--dir`` (default: the temporary directory) and is removed only when the run ends:
on an ext4 file system without a journal (this project's test VMs), creating a file
skips every inode of its block group freed in the last minute or more
(``recently_deleted`` in ext4's allocator), so removing a way's 2,000 files before
the next way ran made each file that way created cost up to ~0.2 ms of kernel time
-- the order of the ways, not the way, set their times. Other processes freeing
files near ``--dir`` still do: put it where little is deleted. ``--keep`` leaves the
run's directory (its path is printed) for the caller to remove once a series of runs
is over, so that no run is measured just after another's deletions.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

META = b'{"kind":"program","name":"bench","v":1}'


def _fill(url: str, n: int, size: int) -> list[bytes]:
    from cuforge.integrations import warmsets
    from cuforge.storage.urls import open_cache

    keys = [b"bench-warm\0" + str(i).encode() for i in range(n)]
    with open_cache(url) as cache:
        for at in range(0, n, 64):
            cache.set_entries([(k, os.urandom(size), META) for k in keys[at : at + 64]])
        assert warmsets.publish(cache, "bench", keys, replace=True) == n
        found = warmsets.load_set(cache, "bench")
        assert found is not None and found.pack is not None and found.pack.entries == n
    return keys


def _level(local: str, kind: str) -> str:
    return f"file://{local}" if kind == "file" else f"sqlite://{local}/cache.db"


def _prefetch(shared: str, local: str, kind: str, pack: bool) -> float:
    from cuforge.integrations import warmsets
    from cuforge.storage.urls import open_cache

    start = time.perf_counter()
    with open_cache(f"{_level(local, kind)},{shared}") as cache:
        tier = warmsets.local_tier(cache)
        assert tier is not None
        found = warmsets.load_set(cache, "bench")
        assert found is not None
        if pack:
            done = warmsets.prefetch(tier, found.keys, name="bench", pack=found.pack)
        else:
            done = warmsets.prefetch(tier, found.keys)
    took = time.perf_counter() - start
    assert done.fetched == len(found.keys), done
    return took


def _one_by_one(shared: str, local: str, kind: str, keys: list[bytes]) -> float:
    from cuforge.storage.urls import open_cache

    start = time.perf_counter()
    with open_cache(f"{_level(local, kind)},{shared}") as cache:
        got = sum(cache.get_entry(k) is not None for k in keys)
    took = time.perf_counter() - start
    assert got == len(keys)
    return took


def _floor(local: str, n: int, size: int, payloads: list[bytes]) -> float:
    """N entries as plain files of the FileStream layout: no fetch, no check."""
    side = os.urandom(76)
    start = time.perf_counter()
    entries = os.path.join(local, "entries")
    os.mkdir(entries)
    made: set[str] = set()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    for i in range(n):
        name = os.urandom(32).hex()
        shard = os.path.join(entries, name[:2])
        if shard not in made:
            os.mkdir(shard)
            made.add(shard)
        base = f"{shard}/{name[2:]}"
        for path, data in ((base + ".cfsum", side), (base, payloads[i])):
            fd = os.open(path, flags, 0o600)
            os.write(fd, data)
            os.close(fd)
    return time.perf_counter() - start


def _bulk_redis(client: object, local: str) -> float:
    """One GET by cuforge's small RESP client (2-3x faster here than redis-py
    without hiredis: the fastest client at hand sets the bar), written to one file."""
    start = time.perf_counter()
    data = client.call(b"GET", b"bench-bulk")  # type: ignore[attr-defined]
    with open(os.path.join(local, "bulk"), "wb") as f:
        f.write(data)
    return time.perf_counter() - start


def _bulk_s3(store: object, local: str) -> float:
    import obstore

    start = time.perf_counter()
    data = obstore.get(store, "bench-bulk").bytes()
    with open(os.path.join(local, "bulk"), "wb") as f:
        f.write(data)  # the client's buffer itself, not a copy
    return time.perf_counter() - start


def _cpu() -> float:
    """This process's CPU seconds so far, every thread, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_of(pid: int) -> float:
    """CPU seconds process ``pid`` used so far (Linux; 0.0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _relay(port: int, one_way_ms: float) -> tuple[subprocess.Popen[str], int]:
    """A delay relay (``_delay.py``) in front of ``port``; the relay's port."""
    from _redis import free_port

    listen = free_port()
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "_delay.py"), str(listen), str(port), str(one_way_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc, listen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--size", type=int, default=32 << 10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=("redis", "s3"), default=None)
    ap.add_argument("--local", choices=("file", "sqlite"), default="file")
    ap.add_argument("--rtt", type=float, default=0.0, metavar="MS")
    ap.add_argument("--dir", default=None, help="where the run's directories go")
    ap.add_argument("--keep", action="store_true", help="leave them; print where")
    args = ap.parse_args()
    from _redis import RedisServer
    from _s3 import SeaweedServer

    work = Path(tempfile.mkdtemp(prefix="bench-warmset-", dir=args.dir))
    servers: list[object] = []
    relays: list[subprocess.Popen[str]] = []
    results: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, dict[str, list[tuple[float, float]]]] = {}
    pids: dict[str, int] = {}
    nbytes = args.entries * args.size
    try:
        backends: dict[str, tuple[str, object, object]] = {}
        if args.only in (None, "redis"):
            redis = RedisServer(work / "redis")
            servers.append(redis)
            pids["redis"] = redis.proc.pid  # type: ignore[union-attr]
            port = redis.port
            if args.rtt:
                relay, port = _relay(port, args.rtt / 2)
                relays.append(relay)
            import redis as redis_py

            from cuforge.storage.redis._resp import RespClient

            redis_py.Redis(host="127.0.0.1", port=port).set(b"bench-bulk", os.urandom(nbytes))
            client = RespClient("127.0.0.1", port, timeout=60, connect_timeout=10)
            backends["redis"] = (f"redis://127.0.0.1:{port}/0", client, _bulk_redis)
        if args.only in (None, "s3"):
            (work / "s3").mkdir()
            s3 = SeaweedServer(work / "s3")
            servers.append(s3)
            pids["s3"] = s3.proc.pid  # type: ignore[union-attr]
            os.environ.update(SeaweedServer.client_env())
            if args.rtt:
                relay, port = _relay(s3.ports["s3"], args.rtt / 2)
                relays.append(relay)
                s3.ports["s3"] = port  # clients go through the relay
            import obstore

            raw = s3.raw()
            obstore.put(raw, "bench-bulk", os.urandom(nbytes))
            backends["s3"] = (s3.url(), raw, _bulk_s3)
        keys = {name: _fill(url, args.entries, args.size) for name, (url, _, _) in backends.items()}
        payloads = [os.urandom(args.size) for _ in range(args.entries)]
        ways = ["bulk", "prefetch", "per key", "one by one"]
        ways += ["floor"] if args.local == "file" else []
        for r in range(args.rounds):
            for name, (url, handle, bulk) in backends.items():
                times = results.setdefault(name, {})
                used = cpu.setdefault(name, {})
                for what in ways:
                    local = tempfile.mkdtemp(dir=work, prefix=f"local-{r}-")  # kept: see above
                    mine, theirs = _cpu(), _cpu_of(pids[name])
                    if what == "bulk":
                        took = bulk(handle, local)  # type: ignore[operator]
                    elif what == "floor":
                        took = _floor(local, args.entries, args.size, payloads)
                    elif what in ("prefetch", "per key"):
                        took = _prefetch(url, local, args.local, pack=what == "prefetch")
                    else:
                        took = _one_by_one(url, local, args.local, keys[name])
                    times.setdefault(what, []).append(took)
                    used.setdefault(what, []).append((_cpu() - mine, _cpu_of(pids[name]) - theirs))
        where = f"{args.rtt:g} ms round trip (relay)" if args.rtt else "loopback"
        print(
            f"{args.entries} entries x {args.size // 1024} KiB = {nbytes / (1 << 20):.1f} MiB "
            f"into an empty {args.local}:// level, {where}, {args.rounds} rounds; "
            "median (best) seconds"
        )
        for name, times in results.items():
            med = {w: statistics.median(t) for w, t in times.items()}
            cells = "  ".join(f"{w}: {med[w]:.3f} ({min(t):.3f})" for w, t in times.items())
            print(f"{name:6s} {cells}")
            floor = ""
            if "floor" in med:
                floor = f"; prefetch / floor = {med['prefetch'] / med['floor']:.2f}"
            print(
                f"{name:6s} prefetch / bulk = {med['prefetch'] / med['bulk']:.2f} (goal <= 2); "
                f"one by one / prefetch = {med['one by one'] / med['prefetch']:.1f} (goal >= 10); "
                f"per key / bulk = {med['per key'] / med['bulk']:.2f}; "
                f"one by one / per key = {med['one by one'] / med['per key']:.1f}" + floor
            )
        print("CPU, median ms: this process (the server)")
        for name, used in cpu.items():
            cells = "  ".join(
                f"{w}: {statistics.median(c for c, _ in u) * 1e3:.0f} "
                f"({statistics.median(s for _, s in u) * 1e3:.0f})"
                for w, u in used.items()
            )
            print(f"{name:6s} {cells}")
    finally:
        for relay in relays:
            relay.kill()
            relay.wait()
        for server in servers:
            server.stop() if hasattr(server, "stop") else server.kill()  # type: ignore[attr-defined]
        if args.keep:
            print(f"kept {work}: remove it once the series of runs is over")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
