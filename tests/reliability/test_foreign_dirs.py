"""Directories that are not caches, and a user's files inside one (issue 32, item 5).

Every way a FileStream cache is opened -- the API writable, read-only, trusting
shared directories, the default cache with and without a secret, every ``cuforge
cache`` command and ``doctor`` -- is pointed at folders that are not caches (a
home-like folder, a root-like one whose ``tmp/`` is sticky and world-writable, a
project folder), each holding files shaped like what the cache used to sweep or
clear. Then a tagged cache holds a user's files among its own through eviction,
``clear()``, ``verify --fix``, temp sweeps and counter folding. What is counted:
files deleted, created or changed -- 0 everywhere.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from _cli import SAXPY, run
from _figures import SCALES, pick, record
from _userdirs import NOT_A_CACHE, old_file, snapshot, user_folder
from cuforge.storage import CachePathError, CacheWriteWarning, FileStreamProgramCache
from cuforge.storage.config import default_cache

CLI_ACTIONS = [
    ["stats"], ["ls"], ["show", "ab"], ["verify"], ["verify", "--fix"], ["clear", "--yes"],
    ["prune", "--older-than", "1s"], ["zero-stats"], ["explain", str(SAXPY), "--arch", "sm_90"],
]  # fmt: skip


def _folders(base: Path, files: int) -> list[Path]:
    """A home-like, a root-like (sticky 1777 tmp/) and a project folder, each with
    ``files`` more files in the shapes the cache used to delete."""
    home = user_folder(base / "home")
    (home / ".bashrc").write_text("export X=1\n")
    root = user_folder(base / "root")
    (root / "etc").mkdir()
    (root / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    (root / "tmp").chmod(0o1777)
    project = user_folder(base / "project")
    (project / "src").mkdir()
    (project / "src" / "k.cu").write_text("// mine\n")
    for folder in (home, root, project):
        for i in range(files):
            shapes = (
                f"tmp/{i}.log", f"tmp/{i}.x.tmp", f"tmp/{4000 + i}-0badcafe.{i}.tmp",
                f"stats/h-{i}-0badcafe.cnt", f"entries/{i % 256:02x}/{i:062x}",
            )  # fmt: skip
            old_file(folder / shapes[i % len(shapes)], b"%d" % i)
    return [home, root, project]


@SCALES
def test_folders_that_are_not_caches_are_refused_and_untouched(
    tmp_path: Path, scale: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    folders = _folders(tmp_path, pick(scale, 20, 400))
    before = {f: snapshot(f) for f in folders}
    tries = 0
    for folder in folders:
        for how in ({}, {"read_only": True}, {"trust_shared": True}, {"max_size_bytes": 1}):
            with pytest.raises(CachePathError, match="is not a cuforge cache"):
                FileStreamProgramCache(folder, **how)
            tries += 1
        for secret in (None, "s" * 32):
            monkeypatch.setenv("HOME", str(folder))
            monkeypatch.setenv("CUFORGE_CACHE", str(folder))
            if secret is None:
                monkeypatch.delenv("CUFORGE_CACHE_SECRET", raising=False)
            else:
                monkeypatch.setenv("CUFORGE_CACHE_SECRET", secret)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert default_cache() is None
            assert [w.category for w in caught] == [CacheWriteWarning]
            tries += 1
    cli = 0
    for folder in folders:
        for action in CLI_ACTIONS:
            result = run(tmp_path, "cache", *action, "--cache", str(folder))
            assert result.returncode == 2 and NOT_A_CACHE in result.stderr, (action, result)
            assert len(result.stderr.strip().splitlines()) == 1
            cli += 1
        doctor = run(tmp_path, "doctor", "--json", "--cache", str(folder))
        assert doctor.returncode == 1
        assert any(NOT_A_CACHE in p for p in json.loads(doctor.stdout)["problems"])
        cli += 1
    changed = sum(snapshot(f) != before[f] for f in folders)
    assert changed == 0
    files = sum(len(b) for b in before.values())
    record(
        "security", "filestream",
        "folders that are not caches (home-like, root-like with a sticky 1777 tmp/, project; "
        f"{files} objects in the shapes once swept) x writable, read-only, trust_shared, capped, "
        "default cache with and without a secret",
        tries,
        "every one refused (CachePathError, one line; the default cache: one warning, "
        "compiles uncached); 0 files deleted, created or changed",
        scale=scale, lost=0,
    )  # fmt: skip
    record(
        "inputs", "cli",
        "folders that are not caches x stats/ls/show/verify/verify --fix/clear/prune/"
        "zero-stats/explain/doctor",
        cli,
        "every one: exit 2 with one line naming the path and the fix (doctor: exit 1, the "
        "problem listed), no traceback; 0 files deleted, created or changed",
        scale=scale, lost=0,
    )  # fmt: skip


@SCALES
def test_a_users_files_inside_a_cache_survive_everything_the_cache_deletes(
    tmp_path: Path, scale: str
) -> None:
    n = pick(scale, 30, 600)
    root = tmp_path / "cache"
    FileStreamProgramCache(root).close()
    mine: list[Path] = []
    for i in range(n):
        shapes = (
            f"entries/notes-{i}.txt", f"entries/{i % 256:02x}/notes-{i}.txt",
            f"entries/{i % 256:02x}/{i:062x}.bak", f"entries/dir-{i}/{i:062x}",
            f"tmp/{i}.log", f"tmp/{i}.x.tmp", f"stats/x-{i}.cnt", f"locks/readme-{i}",
        )  # fmt: skip
        mine.append(old_file(root / shapes[i % len(shapes)], b"%d" % i))
    kept = {p: p.read_bytes() for p in mine}
    rounds = pick(scale, 2, 10)
    for r in range(rounds):
        with FileStreamProgramCache(root, max_size_bytes=40_000) as c:
            for i in range(80):  # twice the cap: eviction scans and sweeps
                c[f"r{r}k{i}"] = bytes([i]) * 1000
            assert c.stats().evictions > 0 and c.foreign_objects() == []
            if r % 2:
                c.clear()
        fixed = run(tmp_path, "cache", "verify", "--fix", "--cache", str(root))
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    cleared = run(tmp_path, "cache", "clear", "--yes", "--cache", str(root))
    assert cleared.returncode == 0, cleared.stderr
    lost = sum(p.read_bytes() != data for p, data in kept.items() if p.exists())
    gone = sum(not p.exists() for p in kept)
    assert (lost, gone) == (0, 0)
    record(
        "security", "filestream",
        f"{n} files of a user's inside a cache (entries/, shards, tmp/, stats/, locks/; "
        "names not of the layout) through eviction, clear(), verify --fix, clear --yes, "
        "temp sweeps and counter folding",
        rounds,
        f"all {n} kept byte-identical; not listed, counted or reported as foreign objects",
        scale=scale, lost=0,
    )  # fmt: skip
