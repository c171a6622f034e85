"""Only a hit is a use: reading entries for ``cuforge cache`` commands never moves an
entry's "last used" (what ``prune --unused-for`` and ``--max-size`` go by).

Redis is covered in test_storage_redis_ownership.py (the server's idle clock); here
the FileStream cache, whose last use is the payload file's access time.
"""

from __future__ import annotations

import os
import time

import pytest

from _cli import run
from cuforge.storage import FileStreamProgramCache, entry_id

DAY = 86400 * 10**9


def _payload(root, key: bytes) -> str:
    eid = entry_id(key)
    return os.path.join(root, "entries", eid[:2], eid[2:])


def _age(path: str, days: float) -> None:
    """Access time ``days`` ago, modification a day before that (as an entry last
    hit ``days`` ago)."""
    now = time.time_ns()
    os.utime(path, ns=(now - int(days * DAY), now - int((days + 1) * DAY)))


def _kernel_stamps_reads(path: str) -> bool:
    """Whether a plain read of an old file moves its atime here (relatime and
    strictatime mounts do; noatime ones never do, and show nothing)."""
    before = os.stat(path).st_atime_ns
    with open(path, "rb") as f:
        f.read(1)
    moved = os.stat(path).st_atime_ns != before
    return moved


def test_verify_and_a_dry_run_are_no_use_of_a_filestream_entry(tmp_path):
    """``cache verify`` (and ``prune``'s reads) read payloads with plain opens: under
    ``relatime`` the kernel moved a day-old atime to now, so a daily ``cache verify``
    kept every entry "used" and ``prune --unused-for 7d`` never removed one."""
    root = tmp_path / "cache"
    with FileStreamProgramCache(root) as c:
        c.set_entry(b"cold", b"cold payload", b"")
        c.set_entry(b"warm", b"warm payload", b"")
        probe = tmp_path / "probe"
        probe.write_bytes(b"x")
        _age(str(probe), 3)
        if not _kernel_stamps_reads(str(probe)):
            pytest.skip("this file system never updates access times on reads (noatime)")
        cold, warm = _payload(root, b"cold"), _payload(root, b"warm")
        _age(cold, 3)
        _age(warm, 3)
        assert c.get(b"warm") == b"warm payload"  # a hit now: warm is used
    stamped = os.stat(cold).st_atime_ns
    reads = [
        ("cache", "verify"),
        ("cache", "ls", "--json"),
        ("cache", "stats"),
        ("cache", "prune", "--unused-for", "1d", "--dry-run"),
    ]
    for args in reads:
        result = run(tmp_path, *args, "--cache", str(root))
        assert result.returncode == 0, (args, result.stderr)
        assert os.stat(cold).st_atime_ns == stamped, args  # still unused for 3 days
    pruned = run(tmp_path, "cache", "prune", "--unused-for", "1d", "--cache", str(root))
    assert pruned.returncode == 0, pruned.stderr
    assert "removed 1 entry" in pruned.stdout, pruned.stdout
    assert not os.path.exists(cold) and os.path.exists(warm)
