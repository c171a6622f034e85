"""Who a cache command speaks as, said truly: each test runs the installed ``cuforge``
console script in a subprocess on a real redis-server or a closed loopback port, and
fails on the main it was written against.

- A Redis URL with a user name and no password (``redis://ro@host``): redis-py (doctor,
  cache stats, cache clear) authenticates as ``ro`` with an empty password, the hit
  path's client sent no ``AUTH`` and compiled as ``default`` -- "compiled and stored"
  through a read-only or disabled user; and the URL was shown as ``redis://ro:***@``,
  a password that does not exist.
- S3 with both key variables set and an endpoint nothing listens on, whose port starts
  with the instance-metadata port's digits: "no AWS credentials" and ``not stored:
  failed`` (the metadata address ``127.0.0.1:1`` was found inside ``127.0.0.1:19…``).
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

from _cli import SAXPY, no_aws_env, run
from _redis import RedisServer, free_port
from reliability._figures import record


def _compile(tmp_path: Path, url: str, name: str, **env: str) -> subprocess.CompletedProcess[str]:
    out = str(tmp_path / name)
    extra = {"env": env_of(tmp_path, **env)} if env else {}
    return run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", out, "--cache", url,
               **extra)  # fmt: skip


def env_of(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No AWS credentials anywhere (variables, profiles under HOME) but ``extra``."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return no_aws_env(tmp_path, HOME=str(home), **extra)


def _doctor(tmp_path: Path, url: str) -> tuple[int, dict[str, object]]:
    done = run(tmp_path, "doctor", "--cache", url, "--json")
    return done.returncode, json.loads(done.stdout)


# -- 1. a user name without a password is that user, for every command ----------------
def test_a_redis_user_without_a_password_is_that_user_for_compiles_too(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """``ro`` (``nopass``, reads only) refuses writes to doctor and to compile alike:
    the compile says not stored and no key is written (before: stored as ``default``).
    Disabled, it is refused to both (before: doctor AuthenticationError, compile
    "compiled and stored"). ``rw`` (``nopass``, everything) stores as itself where
    ``default`` may not write, and is shown as ``redis://rw@…``, without ``:***``."""
    raw = redis_server.client()
    raw.execute_command("ACL", "SETUSER", "ro", "on", "nopass", "~*", "&*", "+@read", "-@write")
    raw.execute_command("ACL", "SETUSER", "rw", "on", "nopass", "~*", "&*", "+@all")
    port = redis_server.port
    ro = f"redis://ro@127.0.0.1:{port}/0"

    code, report = _doctor(tmp_path, ro)
    assert (code, report["exists"], report["writable"]) == (0, True, False), report
    assert str(report["writable_reason"]).startswith("the server refuses writes: NoPermission")
    built = _compile(tmp_path, ro, "a.cubin")
    assert built.returncode == 0, built.stderr
    assert "not stored" in built.stdout and "stored in" not in built.stdout, built.stdout
    assert "NOPERM" in built.stderr, built.stderr  # the user's refusal, not default's
    assert ":***" not in built.stdout + built.stderr, built.stdout + built.stderr
    assert raw.dbsize() == 0  # nothing written, as ro or as default

    raw.execute_command("ACL", "SETUSER", "ro", "off")
    code, report = _doctor(tmp_path, ro)
    assert code == 1 and "(AuthenticationError" in str(report["problems"]), report
    refused = _compile(tmp_path, ro, "b.cubin")
    assert refused.returncode == 0, refused.stderr
    assert "not stored" in refused.stdout and "stored in" not in refused.stdout, refused.stdout
    assert "WRONGPASS" in refused.stderr, refused.stderr
    assert raw.dbsize() == 0

    # default may only read now: a store that lands was made as rw
    raw.execute_command("ACL", "SETUSER", "default", "nopass", "resetkeys", "~*", "-@all",
                        "+@read", "+ping", "+hello", "+auth", "+select")  # fmt: skip
    rw = f"redis://rw@127.0.0.1:{port}/0"
    stored = _compile(tmp_path, rw, "c.cubin")
    assert stored.returncode == 0, stored.stderr
    assert f"(compiled and stored in {rw})" in stored.stdout, stored.stdout
    assert raw.dbsize() > 0
    with_password = f"redis://rw:sekrit@127.0.0.1:{port}/0,{rw}"
    from cuforge.storage import open_cache

    shown = repr(open_cache(f"{tmp_path / 'front'},{with_password}"))
    assert f"'redis://rw:***@127.0.0.1:{port}/0'" in shown and f"'{rw}'" in shown, shown
    record(
        "use", "cli", "redis://USER@... without a password (nopass read-only user, the user "
        "disabled, a nopass writer while default only reads): doctor and compile", 3,
        "compile authenticates as USER with an empty password as redis-py does: read-only "
        "-> 'not stored' (NOPERM), no key; disabled -> 'not stored' (WRONGPASS); writer -> "
        "'stored in redis://rw@...' (no ':***'); before: compiled as default, 'compiled and "
        "stored in redis://ro:***@...' while doctor said writable no / AuthenticationError",
        scale="all",
    )  # fmt: skip


# -- 2. keys set: an endpoint that does not answer is unreachable, never "no credentials"
def _closed_pair() -> tuple[int, int]:
    """``(endpoint, metadata)``: two closed loopback ports, the metadata one's digits a
    prefix of the endpoint's (``1234`` and ``12345``)."""
    for _ in range(200):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port // 10))
            except OSError:
                continue
        return port, port // 10
    raise RuntimeError("no pair of free loopback ports found")


def test_s3_with_keys_and_an_endpoint_sharing_the_metadata_ports_digits_is_unreachable(
    tmp_path: Path,
) -> None:
    endpoint, metadata = _closed_pair()
    url = f"s3://bucket/pfx?endpoint=http://127.0.0.1:{endpoint}"
    where = {"AWS_METADATA_ENDPOINT": f"http://127.0.0.1:{metadata}"}
    keys = {"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI"}
    listed = run(tmp_path, "cache", "ls", "--cache", url, env=env_of(tmp_path, **where, **keys))
    assert listed.returncode == 1, listed.stdout
    assert "credentials" not in listed.stderr, listed.stderr
    assert "error sending request" in listed.stderr, listed.stderr
    built = _compile(tmp_path, url, "a.cubin", **where, **keys)
    assert built.returncode == 0 and "not stored: unreachable" in built.stdout, built.stdout
    assert "credentials" not in built.stderr, built.stderr

    # keys from a profile (HOME/.aws/credentials): the same
    aws = tmp_path / "home" / ".aws"
    aws.mkdir(parents=True)
    (aws / "credentials").write_text(
        "[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = x\n"
    )
    profiled = _compile(tmp_path, url, "b.cubin", **where)
    assert "not stored: unreachable" in profiled.stdout, profiled.stdout
    assert "credentials" not in profiled.stderr, profiled.stderr
    (aws / "credentials").unlink()

    # no keys anywhere: the lookup falls through to the metadata address, which says so
    bare = _compile(tmp_path, url, "c.cubin", **where)
    assert bare.returncode == 0 and "not stored: failed" in bare.stdout, bare.stdout
    assert "no AWS credentials" in bare.stderr, bare.stderr
    stats = run(tmp_path, "cache", "ls", "--cache", url, env=env_of(tmp_path, **where))
    assert stats.returncode == 1 and "no AWS credentials" in stats.stderr, stats.stderr
    record(
        "use", "cli", "s3://...?endpoint=http://127.0.0.1:P (closed), AWS_METADATA_ENDPOINT at "
        "a closed port whose digits start P: keys in the environment, keys in a profile, none",
        3, "keys: cache ls 'HTTP error: error sending request', compile 'not stored: "
        "unreachable', no word of credentials; none: 'no AWS credentials' (before: 'no AWS "
        "credentials' and 'not stored: failed' with both keys set)", scale="all",
    )  # fmt: skip
