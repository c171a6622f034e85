"""A newcomer pass (issue 36: every message true), branch idauth: each test runs the
installed ``cuforge`` console script in a subprocess on real caches (real NVRTC
compiles, a real redis-server) and fails on the main it was written against.

- 1. ``print(toolkit_headers())`` said ``identity 7eee1002a103d503`` while ``cuforge
  cache show`` said ``...|headers:0efdc041c84f`` for an entry those very headers
  compiled (blake2b of 8 bytes against 6: neither a prefix of the other), so a user
  could not match an entry to its header set. Both print one digest now
  (``_toolkit.identity_digest``, the form entries already record; keys unchanged).
- 2. a Redis server that is up and refuses the URL's password: the warning said the
  command's counts are kept "only if the server answers again ...: while it is
  down, ... are not kept". It answers; it refuses. The warning's end is said per
  cause now (down / refusing / nothing sent), in the library and the CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _cli import SAXPY, isolated_env, no_aws_env, run
from _redis import RedisServer, free_port

NO_PASSWORD = "AUTH <password> called without any password configured"
#: str() first: the digest is compared before the property is looked at.
REPORT = (
    "from cuforge.utils import toolkit_headers as t; r = t(); "
    "print(r, flush=True); print(r.identity_digest)"
)


# -- 1. one digest of the header set's identity ------------------------------------------
def test_toolkit_headers_prints_the_digest_an_entry_records(tmp_path: Path) -> None:
    cache = str(tmp_path / "c")
    made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90",
               "-o", str(tmp_path / "s.cubin"), "--cache", cache)  # fmt: skip
    assert made.returncode == 0, made.stderr
    listed = run(tmp_path, "cache", "ls", "--cache", cache)
    assert listed.returncode == 0, listed.stderr
    [row] = listed.stdout.splitlines()
    entry = row.split("\t")[0]
    shown = run(tmp_path, "cache", "show", entry, "--cache", cache)
    assert shown.returncode == 0, shown.stderr
    [compiler] = [ln for ln in shown.stdout.splitlines() if ln.startswith("compiler ")]
    report = subprocess.run([sys.executable, "-c", REPORT], capture_output=True, text=True,
                            env=isolated_env(tmp_path), timeout=240)  # fmt: skip
    [identity] = [ln.split()[1] for ln in report.stdout.splitlines()
                  if ln.startswith("  identity ")]  # fmt: skip
    # What a user greps for: the entry's recorded compiler names this header set.
    assert compiler.endswith(f"|headers:{identity})"), (compiler, report.stdout)
    assert report.returncode == 0, report.stderr
    assert report.stdout.splitlines()[-1] == identity  # the property is what str() prints
    as_json = run(tmp_path, "cache", "show", entry, "--cache", cache, "--json")
    assert json.loads(as_json.stdout)["compiler"].endswith(f"|headers:{identity}")


# -- 2. the warning's end, per cause -----------------------------------------------------
def _warning(stderr: str) -> str:
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("cuforge: warning:")]
    return line


def test_a_server_refusing_the_password_is_not_said_to_be_down(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    url = redis_server.url.replace("redis://", "redis://:pw@")
    made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90",
               "-o", str(tmp_path / "p.cubin"), "--cache", url)  # fmt: skip
    assert made.returncode == 0 and "not stored: failed" in made.stdout, made.stderr
    warning = _warning(made.stderr)
    assert NO_PASSWORD in warning and "the server answered with an error" in warning, warning
    assert "answers again" not in warning and "while it is down" not in warning, warning
    assert "only if the server accepts this command's counts before it ends" in warning, warning
    assert "while it refuses them" in warning, warning
    assert "(misses included) are not kept" in warning, warning
    assert "stats()" not in warning and "_failures" not in warning, warning
    # As it says: none of the command's counts (nor anything else) reached the server.
    assert redis_server.client().dbsize() == 0


def test_a_down_server_and_a_request_never_sent_keep_their_own_words(tmp_path: Path) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: refused connections
    build = ("compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "d.cubin"))
    made = run(tmp_path, *build, "--cache", down)
    assert made.returncode == 0 and "not stored: unreachable" in made.stdout, made.stderr
    warning = _warning(made.stderr)
    assert "only if the server answers again before this command ends: while it is down" in (
        warning
    ), warning
    # No AWS credentials anywhere: nothing is sent, the server is neither down nor refusing.
    env = no_aws_env(tmp_path)
    (tmp_path / "home").mkdir()
    env["HOME"] = str(tmp_path / "home")
    s3 = f"s3://bucket/x?endpoint=http://127.0.0.1:{free_port()}"
    bare = run(tmp_path, *build, "--cache", s3, env=env)
    assert bare.returncode == 0 and "not stored: failed" in bare.stdout, bare.stderr
    warning = _warning(bare.stderr)
    assert "nothing was sent to the server" in warning, warning
    assert "answers again" not in warning and "while it is down" not in warning, warning
    assert "only if this command can send them to the server before it ends" in warning, warning
    assert "while it cannot (the cause above)" in warning, warning
