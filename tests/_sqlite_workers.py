"""Subprocess workers for the SQLiteProgramCache tests.

Run as ``python tests/_sqlite_workers.py <command> <json args>``; each command
prints one JSON document on stdout (or holds something until it is killed). Every
worker is a fresh interpreter with its own connections, locks and NVRTC.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
import warnings

from _cache_workers import ARCH, SRC, count_compiles, wait_barrier


def _ready(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def cmd_compile(args: dict) -> dict:
    """Compile SRC to cubin through ``SQLiteProgramCache(args["db"])``."""
    from cuforge.compile import Program, ProgramOptions
    from cuforge.utils import CacheWriteWarning, SQLiteProgramCache

    if args.get("counter"):
        count_compiles(args["counter"])
    program = Program(SRC, "c++", ProgramOptions(arch=ARCH))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SQLiteProgramCache(args["db"], timeout=args.get("timeout", 5.0)) as cache:
            if args.get("barrier"):
                wait_barrier(args["barrier"], args["parties"])
            obj = program.compile("cubin", cache=cache)
            stats = cache.stats().as_dict()
    return {
        "sha256": hashlib.sha256(obj.code).hexdigest(),
        "stats": stats,
        "write_warnings": [str(w.message) for w in caught if w.category is CacheWriteWarning],
    }


def cmd_hold_write(args: dict) -> dict:
    """Hold the database's write lock (``BEGIN IMMEDIATE``) until killed.

    With ``exclusive`` the connection uses ``locking_mode=EXCLUSIVE`` after a write,
    which keeps readers out as well.
    """
    import sqlite3

    conn = sqlite3.connect(args["db"], isolation_level=None)
    if args.get("exclusive"):
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE cuforge_state SET hits = hits")
    _ready(args["ready"], "held")
    while True:
        time.sleep(60)


def cmd_hold_read(args: dict) -> dict:
    """Hold a read transaction (one snapshot) open until killed: what a reader
    descheduled in the middle of a read does for a while on a loaded machine. Begun
    while the WAL holds frames, it keeps the WAL from being restarted or emptied."""
    import sqlite3

    conn = sqlite3.connect(args["db"], isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("SELECT count(*) FROM cuforge_entries").fetchall()
    _ready(args["ready"], "held")
    while True:
        time.sleep(60)


def cmd_hold_new_file(args: dict) -> dict:
    """Make ``args["db"]`` an SQLite file in rollback mode with no tables (what a cache
    opener sees while a peer creates it), hold its write lock ``args["seconds"]``,
    then let go and exit -- a peer caught between creating the file and switching it
    to WAL."""
    import sqlite3

    conn = sqlite3.connect(args["db"], isolation_level=None)
    conn.execute("CREATE TABLE scratch (x)")
    conn.execute("DROP TABLE scratch")
    conn.execute("BEGIN IMMEDIATE")
    _ready(args["ready"], "held")
    time.sleep(args["seconds"])
    conn.execute("COMMIT")
    return {}


def cmd_hold_key(args: dict) -> dict:
    """Take the single-flight lock of ``args["key"]`` and hold it until killed."""
    from cuforge.utils import SQLiteProgramCache

    cache = SQLiteProgramCache(args["db"])
    with cache.lock(args["key"], timeout=10) as held:
        _ready(args["ready"], "held" if held else "not held")
        while True:
            time.sleep(60)


def cmd_wait_key(args: dict) -> dict:
    """Wait for ``args["key"]``'s lock; report whether it was held and how long it took."""
    from cuforge.utils import SQLiteProgramCache

    with SQLiteProgramCache(args["db"]) as cache:
        t0 = time.monotonic()
        with cache.lock(args["key"], timeout=args["timeout"]) as held:
            waited = time.monotonic() - t0
    return {"held": held, "waited": waited}


def cmd_contend(args: dict) -> dict:
    """Enter ``args["key"]``'s lock, log enter/exit, read-modify-write a counter file."""
    from cuforge.utils import SQLiteProgramCache

    with SQLiteProgramCache(args["db"]) as cache:
        wait_barrier(args["barrier"], args["parties"])
        with cache.lock("hot-key", timeout=30) as held:
            assert held
            with open(args["log"], "a") as f:
                f.write(f"enter {os.getpid()}\n")
            n = 0
            if os.path.exists(args["counter"]):
                with open(args["counter"]) as f:
                    n = int(f.read() or 0)
            time.sleep(0.05)  # a lost update below would show an overlap
            with open(args["counter"], "w") as f:
                f.write(str(n + 1))
            with open(args["log"], "a") as f:
                f.write(f"exit {os.getpid()}\n")
    return {}


def cmd_stress(args: dict) -> dict:
    """Write and read ``args["n"]`` entries under a cap; any wrong byte is an error."""
    from cuforge.utils import SQLiteProgramCache

    idx, size = args["idx"], args["size"]
    payload = bytes([idx]) * size
    wrong = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SQLiteProgramCache(args["db"], max_size_bytes=args["cap"]) as cache:
            if args.get("barrier"):
                wait_barrier(args["barrier"], args["parties"])
            for i in range(args["n"]):
                cache[f"{idx}-{i}"] = payload
                for j in (i, i // 2, i % 7):
                    got = cache.get(f"{idx}-{j}")
                    wrong += got is not None and got != payload
            stats = cache.stats().as_dict()
    return {"wrong": wrong, "stats": stats, "warnings": [str(w.message) for w in caught]}


def cmd_count(args: dict) -> dict:
    """Make ``args["hits"]`` hits and ``args["misses"]`` misses, then close (stats test)."""
    import warnings

    from cuforge.utils import SQLiteProgramCache

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SQLiteProgramCache(args["db"]) as cache:
            cache[b"shared"] = b"x" * 10
            for _ in range(args["hits"]):
                cache.get(b"shared")
            for i in range(args["misses"]):
                cache.get(f"absent-{i}")
            own = cache.stats().as_dict()
    # What this process counted, wrote at close and was warned of: a lost sum then
    # says which side lost it.
    written = cache._driver._w.flushed.as_dict()
    return {"stats": own, "written": written, "warnings": [str(w.message) for w in caught]}


_OPEN_AT_EXIT: list = []


def cmd_exit_open(args: dict) -> dict:
    """Store, make 5 hits and a miss; let a peer process (``hold_write_for``) hold the
    write lock ``args["seconds"]``; store once more (kept in memory) and exit with the
    handle still open: the exit flush must write both rows and every counter once
    the peer lets go."""
    import subprocess

    from cuforge.utils import SQLiteProgramCache

    warnings.simplefilter("ignore")  # the kept store warns; this test reads the file
    cache = SQLiteProgramCache(args["db"])
    _OPEN_AT_EXIT.append(cache)  # alive until the interpreter exits
    cache[b"first"] = b"1" * 10
    for _ in range(5):
        cache.get(b"first")
    cache.get(b"absent")
    ready = args["db"] + ".held"
    subprocess.Popen(
        [sys.executable, __file__, "hold_write_for", json.dumps({**args, "ready": ready})],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not os.path.exists(ready):
        if time.monotonic() > deadline:
            raise TimeoutError("the lock holder never got ready")
        time.sleep(0.005)
    cache[b"kept"] = b"2" * 10  # the lock is held: kept in memory, written at exit
    return {"kept": len(cache._driver._w.deferred.rows)}


def cmd_hold_write_for(args: dict) -> dict:
    """Hold the database's write lock ``args["seconds"]``, then let go and exit."""
    import sqlite3

    conn = sqlite3.connect(args["db"], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    _ready(args["ready"], "held")
    time.sleep(args["seconds"])
    conn.execute("COMMIT")
    return {}


def cmd_efbig(args: dict) -> dict:
    """Store past RLIMIT_FSIZE: a counted write failure, never an exception."""
    import resource
    import signal

    from cuforge.utils import CacheWriteWarning, SQLiteProgramCache

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = SQLiteProgramCache(args["db"])
        cache[b"small"] = b"s" * 100
        resource.setrlimit(resource.RLIMIT_FSIZE, (args["limit"], args["limit"]))
        cache[b"big"] = os.urandom(args["size"])
        result = {
            "small": cache.get(b"small") == b"s" * 100,
            "big": cache.get(b"big") is not None,
            "write_failures": cache.stats().write_failures,
            "warnings": [str(w.message) for w in caught if w.category is CacheWriteWarning],
        }
        cache.close()
    return result


def cmd_open_race(args: dict) -> dict:
    """For each round, wait at the round's barrier, then open ``<dir>/<round>/<name>``
    (with ``args["parties"]`` peers doing the same at once), store and read back one
    key, and close. What happened, per round: "opened" (with whether the key read
    back) or the refusal's type and message."""
    import sqlite3  # noqa: F401  (imported before the race, as an opener would have it)

    from cuforge.utils import SQLiteProgramCache

    outcomes = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for r in range(args["rounds"]):
            wait_barrier(os.path.join(args["barriers"], str(r)), args["parties"])
            path = os.path.join(args["dir"], str(r), args["name"])
            try:
                cache = SQLiteProgramCache(path)
            except Exception as exc:
                outcomes.append({"refused": type(exc).__name__, "message": str(exc)})
                continue
            with cache:
                cache[f"from-{os.getpid()}"] = b"v" * 100
                outcomes.append({"opened": cache.get(f"from-{os.getpid()}") == b"v" * 100})
    return {"outcomes": outcomes, "warnings": [str(w.message) for w in caught]}


def open_race(directory: str, name: str, prepare, rounds: int, parties: int) -> list[dict]:
    """Run ``parties`` ``open_race`` workers: ``rounds`` times they open
    ``<directory>/data/<round>/<name>`` at once (``prepare(path)`` sets each round's
    path up first). Each worker's report; raises if one failed."""
    import subprocess

    for r in range(rounds):
        os.makedirs(os.path.join(directory, "barriers", str(r)))
        os.makedirs(os.path.join(directory, "data", str(r)))
        prepare(os.path.join(directory, "data", str(r), name))
    args = {
        "dir": os.path.join(directory, "data"),
        "barriers": os.path.join(directory, "barriers"),
        "name": name,
        "rounds": rounds,
        "parties": parties,
    }
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, "open_race", json.dumps(args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(parties)
    ]
    reports = []
    for w in workers:
        out, err = w.communicate(timeout=600)
        if w.returncode != 0:
            raise AssertionError(f"open_race worker failed: {err}")
        reports.append(json.loads(out))
    return reports


COMMANDS = {
    "compile": cmd_compile,
    "hold_write": cmd_hold_write,
    "hold_read": cmd_hold_read,
    "hold_key": cmd_hold_key,
    "hold_new_file": cmd_hold_new_file,
    "hold_write_for": cmd_hold_write_for,
    "exit_open": cmd_exit_open,
    "wait_key": cmd_wait_key,
    "contend": cmd_contend,
    "stress": cmd_stress,
    "count": cmd_count,
    "efbig": cmd_efbig,
    "open_race": cmd_open_race,
}

if __name__ == "__main__":
    try:
        result = COMMANDS[sys.argv[1]](json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
    except BaseException:
        traceback.print_exc()
        raise
    print(json.dumps(result))
