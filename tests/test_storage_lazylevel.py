"""Lazy tier levels (storage/tiered/_lazylevel.py): a level behind the first persistent one is
opened when a lookup reaches it, never by a front-level hit; deferred stores are written
when it opens, at close and at a normal exit -- checked in real processes on a real
redis-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from cuforge.storage import CacheWriteWarning, FileStreamProgramCache, TieredProgramCache
from cuforge.storage.entry import CacheEntry
from cuforge.storage.redis import RedisProgramCache
from cuforge.storage.tiered._lazylevel import LazyLevel
from cuforge.utils import open_cache


def _python(code: str, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line, returned here."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


_PROBE = """
    import json, sys
    from cuforge.utils import open_cache
    tier = open_cache({url!r})
    {body}
    print(json.dumps({{
        "redis_py": "redis" in sys.modules,
        # the handle (its driver and client with it); the package itself and its
        # ``_url`` load at open, to check the level's URL
        "redis_backend": "cuforge.storage.redis._cache" in sys.modules,
        "result": result,
    }}))
"""


def test_a_front_level_hit_in_a_fresh_process_never_imports_or_opens_redis(
    redis_server, tmp_path: Path
) -> None:
    url = f"file://{tmp_path / 'fs'},{redis_server.url}"
    with FileStreamProgramCache(tmp_path / "fs") as fs:
        fs.set_entry(b"k", b"on disk", b"m")
    body = "result = tier.get_entry(b'k') == (b'on disk', b'm') and tier.stats().hits == 1"
    seen = _python(_PROBE.format(url=url, body=body))
    assert seen == {"redis_py": False, "redis_backend": False, "result": True}
    assert redis_server.client().dbsize() == 0  # nothing was written there either


def test_a_miss_in_front_opens_the_level_behind_and_backfills(redis_server, tmp_path) -> None:
    with RedisProgramCache(redis_server.url) as redis:
        redis.set_entry(b"k", b"in redis", b"m")
    url = f"file://{tmp_path / 'fs'},{redis_server.url}"
    body = "result = [tier.get(b'k').decode(), tier.level_stats()[1].hits]"
    seen = _python(_PROBE.format(url=url, body=body))
    assert seen == {"redis_py": False, "redis_backend": True, "result": ["in redis", 1]}
    with FileStreamProgramCache(tmp_path / "fs") as fs:  # backfilled into the front level
        assert fs.get_entry(b"k") == CacheEntry(b"in redis", b"m")


@pytest.mark.parametrize("ending", ["exit", "close"])
def test_a_deferred_store_reaches_the_level_behind_when_the_process_ends(
    redis_server, tmp_path: Path, ending: str
) -> None:
    url = f"file://{tmp_path / 'fs'},{redis_server.url}"
    body = """
    tier.set_entry(b'k', b'deferred', b'meta')
    lazy = tier._levels[1]
    result = [lazy.opened is None, lazy.pending, "redis" in sys.modules]
    """ + ("tier.close()" if ending == "close" else "")
    seen = _python(
        _PROBE.format(url=url, body=textwrap.dedent(body).strip().replace("\n", "\n    "))
    )
    # Until the process ended the Redis level was never opened: the store was deferred.
    assert seen["result"] == [True, 1, False]
    with RedisProgramCache(redis_server.url) as redis:
        assert redis.get_entry(b"k") == CacheEntry(b"deferred", b"meta")
    with FileStreamProgramCache(tmp_path / "fs") as fs:
        assert fs.get_entry(b"k") == CacheEntry(b"deferred", b"meta")


def test_a_lookup_through_a_lazy_level_writes_its_deferred_stores_first(
    redis_server, tmp_path: Path
) -> None:
    raw = redis_server.client()
    with open_cache(f"file://{tmp_path / 'fs'},{redis_server.url}") as tier:
        lazy = tier._levels[1]
        assert isinstance(lazy, LazyLevel)
        tier[b"a"] = b"first"
        tier[b"a"] = b"second"  # the last store of a key wins
        tier[b"b"] = b"other"
        assert lazy.opened is None and lazy.pending == 2 and raw.dbsize() == 0
        assert lazy.stats().stores == 0  # statistics never open it
        assert lazy.get(b"a") == b"second"  # opened, deferred stores written first
        assert lazy.pending == 0 and isinstance(lazy.opened, RedisProgramCache)
        assert raw.dbsize() == 2 and lazy.stats().stores == 2
        tier[b"c"] = b"now direct"  # an open level is written through
        assert raw.dbsize() == 3


def test_the_lock_of_a_lazy_widest_level_opens_it(redis_server, tmp_path: Path) -> None:
    with open_cache(f"file://{tmp_path / 'fs'},{redis_server.url}") as tier:
        with tier.lock(b"k") as held:
            assert held and redis_server.client().keys("*:lock")
        assert isinstance(tier._levels[1].opened, RedisProgramCache)


def test_deferred_bytes_past_the_bound_open_the_level(tmp_path: Path) -> None:
    writes: list[bytes] = []

    def opener() -> FileStreamProgramCache:
        writes.append(b"opened")
        return FileStreamProgramCache(tmp_path / "behind")

    lazy = LazyLevel(opener, "behind", max_pending_bytes=100)
    lazy[b"a"] = b"x" * 60
    assert lazy.opened is None and not writes
    lazy[b"b"] = b"y" * 60  # 120 bytes waiting > 100: open and write both
    assert writes == [b"opened"] and lazy.pending == 0
    assert lazy.opened.get(b"a") == b"x" * 60 and lazy.opened.get(b"b") == b"y" * 60
    lazy.close()


def test_a_level_that_cannot_open_is_a_counted_failure_and_the_front_serves(
    tmp_path: Path,
) -> None:
    # A location that is a plain file: found when the level is first reached. (A
    # typo in the URL itself -- ``redis://h/zero`` -- is refused at open instead:
    # test_cli_tier_url_check.py.)
    (tmp_path / "plain").write_bytes(b"not a directory")
    url = f"file://{tmp_path / 'fs'},file://{tmp_path / 'plain'}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tier = open_cache(url)
        assert isinstance(tier, TieredProgramCache)
        tier[b"k"] = b"v"
        assert tier.get(b"k") == b"v"  # the front level answers: the level is not reached
        assert tier.get(b"missing") is None  # reaches it: it fails to open
        assert tier.get(b"missing") is None  # the same error, not a second open
        assert tier.stats().read_failures == 2
        with pytest.raises(OSError, match="exists and is not a directory"):
            tier.levels  # noqa: B018 - opening every level reports the error
        tier.close()  # the deferred store cannot be written: counted, warned
    messages = [str(w.message) for w in caught if w.category is CacheWriteWarning]
    assert any("exists and is not a directory" in m for m in messages), messages
    assert any("deferred entries" in m for m in messages), messages


def test_passwords_stay_out_of_a_lazy_levels_name(tmp_path: Path) -> None:
    tier = open_cache(f"file://{tmp_path},redis://user:sekrit@127.0.0.1:1/0?timeout=1s")
    assert isinstance(tier, TieredProgramCache)
    assert "sekrit" not in repr(tier) and "user:***@127.0.0.1:1/0" in repr(tier)
    tier.close()


def test_memory_in_front_keeps_the_first_persistent_level_eager(tmp_path: Path) -> None:
    tier = open_cache(f"memory://,file://{tmp_path / 'a'},file://{tmp_path / 'b'}")
    assert isinstance(tier, TieredProgramCache)
    kinds = [type(level).__name__ for level in tier._levels]
    assert kinds == ["InMemoryProgramCache", "FileStreamProgramCache", "LazyLevel"]
    tier.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork()")
def test_a_forked_child_leaves_its_parents_deferred_stores_to_the_parent(
    redis_server, tmp_path: Path
) -> None:
    url = f"file://{tmp_path / 'fs'},{redis_server.url}"
    seen = _python(f"""
        import json, os, sys
        from cuforge.storage.redis._resp import RespClient
        from cuforge.utils import open_cache
        tier = open_cache({url!r})
        tier[b"parent"] = b"deferred by the parent"
        pid = os.fork()
        if pid == 0:  # the child ends normally: its exit hooks run
            tier[b"child"] = b"deferred by the child"
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        raw = RespClient("127.0.0.1", {redis_server.port}, timeout=5, connect_timeout=5)
        print(json.dumps([status, len(raw.call("KEYS", "cuforge:{{*}}"))]))
    """)
    assert seen == [0, 1]  # the child wrote only its own store, not the parent's
    with RedisProgramCache(redis_server.url) as redis:  # the parent wrote its own at exit
        assert redis.get(b"parent") == b"deferred by the parent"
        assert redis.get(b"child") == b"deferred by the child"


def test_a_compile_hit_from_the_front_level_never_opens_redis(redis_server, tmp_path) -> None:
    """The first ``Program.compile(cache=True)`` of a fresh process, answered by the disk
    level of ``file://…,redis://…``: no Redis module, no connection."""
    from _cache_workers import ARCH, SRC

    code = f"""
        import json, sys
        from cuforge import Program, ProgramOptions
        out = Program({SRC!r}, "c++", ProgramOptions(arch={ARCH!r})).compile("cubin", cache=True)
        print(json.dumps([len(out.code) > 0, "redis" in sys.modules,
                          "cuforge.storage.redis._cache" in sys.modules]))
    """
    env = {"CUFORGE_CACHE": f"file://{tmp_path / 'fs'},{redis_server.url}"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, **env})  # fmt: skip
    assert out.returncode == 0, out.stderr  # the miss: compiled, stored in both levels
    assert redis_server.client().dbsize() >= 1
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120, env={**os.environ, **env})  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, False, False]


def test_a_store_deferred_by_a_lazy_level_says_so(redis_server, tmp_path: Path) -> None:
    """A store to a level not opened yet is not written yet: its outcome says deferred,
    and the level holds it until it opens (issue 36: say where an entry went)."""
    from cuforge.storage.outcome import DEFERRED, STORED

    with open_cache(f"file://{tmp_path / 'fs'},{redis_server.url}") as tier:
        outcome = tier.set_entry(b"k", b"v")
        assert outcome.stored and outcome.levels[0].reason == STORED
        assert outcome.levels[1] is DEFERRED and "deferred" in DEFERRED.detail
        assert tier.get(b"absent") is None  # the lookup opens the level and writes it
        assert tier.set_entry(b"k2", b"v").levels[1].detail == ""  # written at once now
    with RedisProgramCache(redis_server.url) as redis:
        assert redis.get(b"k") == b"v"
