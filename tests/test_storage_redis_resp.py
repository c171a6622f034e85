"""The Redis hit path's small client (storage/redis/_resp.py) against a real
redis-server: a fresh process hits without importing redis-py, AUTH (password and
ACL user), database selection, large values, a killed and a hung server, and a reply
left unread by a timeout never answering the next command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from _redis import RedisServer
from cuforge.storage import CacheReadWarning
from cuforge.storage.entry import CacheEntry
from cuforge.storage.redis import RedisProgramCache
from cuforge.storage.redis._resp import ReplyError, RespClient


def _fresh(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("ending", ["close", "exit"])
def test_a_fresh_process_hits_and_counts_without_importing_redis_py(
    redis_server, ending: str
) -> None:
    with RedisProgramCache(redis_server.url, ttl=3600) as c:
        c.set_entry(b"k", b"payload", b"meta")
    raw = redis_server.client()
    raw.delete(b"cuforge:stats")
    seen = _fresh(f"""
        import json, sys
        from cuforge.utils import open_cache
        c = open_cache({redis_server.url + "?ttl=1h"!r})
        entry = c.get_entry(b"k")
        missed = c.get_entry(b"absent")
        {"c.close()" if ending == "close" else ""}
        print(json.dumps([entry.data.decode(), entry.meta.decode(), missed,
                          "redis" in sys.modules]))
    """)
    assert seen == ["payload", "meta", None, False]
    fleet = {k.decode(): int(v) for k, v in raw.hgetall(b"cuforge:stats").items()}
    assert fleet["hits"] == 1 and fleet["misses"] == 1  # flushed by the small client
    assert raw.pttl(next(iter(raw.keys(b"cuforge:{*}")))) > 3_000_000  # GETEX renewed it


def test_a_fresh_process_takes_a_lease_without_importing_secrets_or_idna(redis_server) -> None:
    """A rank's first wait on the fleet imported ``secrets`` for the lease's token
    (with base64, hmac and random: ~4 ms) and, connecting, the idna codec that
    getaddrinfo encodes a str host name with (stringprep, unicodedata: ~2.4 ms)."""
    seen = _fresh(f"""
        import json, sys
        from cuforge.utils import open_cache
        c = open_cache({redis_server.url + "?prefix=fresh:"!r})
        with c.lock(b"k") as held:
            c.set_entry(b"k", b"filled", b"")
        print(json.dumps([held, c.get(b"k").decode(), "secrets" in sys.modules,
                          "encodings.idna" in sys.modules]))
    """)
    assert seen == [True, "filled", False, False]


def test_auth_with_a_password_and_with_an_acl_user(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "auth")
    try:
        raw = server.client()
        raw.execute_command("ACL", "SETUSER", "alice", "on", ">apw", "~*", "&*", "+@all")
        raw.config_set("requirepass", "s3cret")  # the default user needs it from now on
        port = server.port
        with RedisProgramCache(f"redis://:s3cret@127.0.0.1:{port}/0") as c:
            c[b"k"] = b"behind a password"
            assert c.get(b"k") == b"behind a password" and c.stats().read_failures == 0
        with RedisProgramCache(f"redis://alice:apw@127.0.0.1:{port}/0") as c:
            assert c.get(b"k") == b"behind a password"
        for wrong in (f"redis://:nope@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with RedisProgramCache(wrong) as c:
                    assert c.get(b"k") is None  # refused: a miss, never an error
                    assert c.stats().read_failures == 1
            (warning,) = [w for w in caught if w.category is CacheReadWarning]  # a lookup
            assert "WRONGPASS" in str(warning.message) or "NOAUTH" in str(warning.message)
    finally:
        server.stop()


def test_the_urls_database_is_selected(redis_server) -> None:
    with RedisProgramCache(redis_server.url.replace("/0", "/3")) as three:
        three[b"k"] = b"in db 3"
    with RedisProgramCache(redis_server.url.replace("/0", "/3")) as three:
        assert three.get(b"k") == b"in db 3"
    with RedisProgramCache(redis_server.url) as zero:
        assert zero.get(b"k") is None


def test_large_values_arrive_whole(redis_server) -> None:
    payload = os.urandom(48 << 20)
    with RedisProgramCache(redis_server.url, timeout=30) as c:
        c.set_entry(b"big", payload, b"m" * 70_000)
    with RedisProgramCache(redis_server.url, timeout=30) as c:
        assert c.get_entry(b"big") == CacheEntry(payload, b"m" * 70_000)


def test_a_killed_server_is_a_counted_miss_and_backs_off(redis_server) -> None:
    with RedisProgramCache(redis_server.url, retry_after=60) as c:
        c[b"k"] = b"v"
        assert c.get(b"k") == b"v"
        redis_server.kill()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert c.get(b"k") is None
            assert c.get(b"k") is None  # skipped: the breaker is open
        assert c.stats().read_failures == 2
        assert len([w for w in caught if w.category is CacheReadWarning]) == 1


@pytest.mark.skipif(os.name == "nt", reason="SIGSTOP")
def test_a_reply_a_timeout_left_unread_never_answers_the_next_command(redis_server) -> None:
    with RedisProgramCache(redis_server.url) as writer:
        writer[b"a"] = b"value of a"
        writer[b"b"] = b"value of b"
    with RedisProgramCache(redis_server.url, timeout=0.3, retry_after=0.2) as c:
        assert c.get(b"a") == b"value of a"  # connected
        redis_server.pause()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CacheReadWarning)
                start = time.monotonic()
                assert c.get(b"a") is None  # times out; a's reply comes later
                assert time.monotonic() - start < 5  # bounded by the command timeout
        finally:
            redis_server.resume()
        time.sleep(0.5)  # the server sends a's reply now; the breaker's wait passes
        assert c.get(b"b") == b"value of b"
        assert c.get(b"a") == b"value of a"
        assert c.stats().read_failures == 1


def test_the_client_itself_reports_errors_and_keeps_in_step(redis_server) -> None:
    client = RespClient("127.0.0.1", redis_server.port, timeout=1, connect_timeout=1)
    assert client.call("SET", b"x", b"1") == b"OK"
    with pytest.raises(ReplyError, match="wrong number of arguments"):
        client.pipeline([("GET",), ("GET", b"x")])
    assert client.pipeline([("GET", b"x"), ("INCR", b"n"), ("GET", b"nothing")]) == [
        b"1",
        1,
        None,
    ]
    client.close()
    redis_server.kill()
    with pytest.raises(OSError):
        client.call("GET", b"x")


def test_threads_sharing_a_handle_each_get_their_own_answers(redis_server) -> None:
    import threading

    with RedisProgramCache(redis_server.url) as writer:
        for i in range(16):
            writer.set_entry(f"k{i}", f"value {i}".encode() * (1 + 5000 * (i == 0)), b"m")
    errors: list[str] = []
    with RedisProgramCache(redis_server.url) as shared:

        def reader(i: int) -> None:
            want = f"value {i}".encode() * (1 + 5000 * (i == 0))
            for _ in range(100):
                got = shared.get(f"k{i}")
                if got != want:
                    errors.append(f"k{i}: {got[:20] if got else got!r}")

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:5]
        assert shared.stats().hits == 1600 and shared.stats().read_failures == 0
        fast = shared._store._fast
        assert fast is not None and 1 <= len(fast._idle) <= 8
