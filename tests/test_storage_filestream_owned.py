"""A FileStream cache creates and deletes only in its own directory (issue 32, item 5).

A directory that is not a cuforge cache -- a home directory, a project folder, ``/``
-- was taken for one: opening it swept ``tmp/`` (files older than an hour, any
``*.*.tmp``), folded and deleted ``stats/*.cnt``, created ``entries/ locks/ stats/
size.ledger*``, and ``clear()`` deleted every regular file below ``entries/``; with a
secret set, a root-like folder's sticky world-writable ``tmp/`` was emptied. Now the
root is tagged (``CACHEDIR.TAG``) and every deletion goes through the ownership gate.
"""

from __future__ import annotations

import os
import stat
import threading
import warnings
from pathlib import Path

import pytest

from _userdirs import NOT_A_CACHE, old_file, snapshot, user_folder
from cuforge.storage import CachePathError, CacheWriteWarning, FileStreamProgramCache, ownership
from cuforge.storage.config import default_cache


@pytest.mark.parametrize(
    "how",
    [{}, {"read_only": True}, {"trust_shared": True}, {"max_size_bytes": 1}],
    ids=["writable", "read-only", "trust-shared", "capped"],
)
def test_a_folder_that_is_not_a_cache_is_refused_and_left_as_it_was(tmp_path, how) -> None:
    folder = user_folder(tmp_path / "mine")
    before = snapshot(folder)
    with pytest.raises(CachePathError) as caught:
        FileStreamProgramCache(folder, **how)
    message = str(caught.value)
    assert NOT_A_CACHE in message and str(folder) in message and "fix:" in message
    assert "\n" not in message and caught.value.path == str(folder)
    assert snapshot(folder) == before


def test_default_cache_in_the_home_directory_warns_compiles_and_touches_nothing(
    tmp_path, monkeypatch
) -> None:
    """HOME=H CUFORGE_CACHE=H: default_cache() emptied H/tmp."""
    from _cache_workers import ARCH, SRC
    from cuforge.compile import Program, ProgramOptions

    home = user_folder(tmp_path / "home")
    (home / ".bashrc").write_text("export X=1\n")
    before = snapshot(home)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CUFORGE_CACHE", str(home))
    monkeypatch.delenv("CUFORGE_CACHE_SECRET", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert default_cache() is None
        obj = Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=True)
    assert obj.code  # the compile does not fail: it runs uncached
    assert [w.category for w in caught] == [CacheWriteWarning]
    assert NOT_A_CACHE in str(caught[0].message)
    assert snapshot(home) == before


def test_a_secret_does_not_make_a_root_like_folder_a_cache(tmp_path, monkeypatch) -> None:
    """trust_shared (set by a secret) accepted world-writable directories, and
    CUFORGE_CACHE=/ swept /tmp (sticky, 1777). The tag rule holds whatever is trusted."""
    fake_root = tmp_path / "root"
    for name in ("etc", "usr", "var"):
        (fake_root / name).mkdir(parents=True)
    (fake_root / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    sticky = fake_root / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    old_file(sticky / "someone-elses.sock.tmp")
    old_file(sticky / "4242-0badcafe.7.tmp")
    old_file(sticky / "4242-0badcafe-7.tmp")
    old_file(sticky / "session")
    before = snapshot(fake_root)
    with pytest.raises(CachePathError, match="is not a cuforge cache"):
        FileStreamProgramCache(fake_root, trust_shared=True)
    monkeypatch.setenv("CUFORGE_CACHE", str(fake_root))
    monkeypatch.setenv("CUFORGE_CACHE_SECRET", "s" * 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert default_cache() is None
    assert [w.category for w in caught] == [CacheWriteWarning]
    assert snapshot(fake_root) == before


def test_a_new_or_empty_directory_becomes_a_tagged_cache(tmp_path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for root in (tmp_path / "new" / "cache", empty):
        with FileStreamProgramCache(root) as c:
            c["k"] = b"v"
        assert ownership.is_tagged(str(root))
        assert stat.S_IMODE((root / "CACHEDIR.TAG").stat().st_mode) == 0o600
        with FileStreamProgramCache(root) as c:  # and reopens as a cache
            assert c.get("k") == b"v"


def test_a_cache_made_before_tags_is_tagged_and_keeps_working(tmp_path) -> None:
    """An existing user's cache has no CACHEDIR.TAG: its size ledger proves it ours."""
    root = tmp_path / "old"
    with FileStreamProgramCache(root, max_size_bytes=10**6) as c:
        c["k"] = b"v"
        c["gone"] = b"x"
    (root / "CACHEDIR.TAG").unlink()  # the layout an older cuforge left
    assert ownership.legacy_root(str(root)) and not ownership.is_tagged(str(root))
    with FileStreamProgramCache(root, read_only=True) as ro:  # looking does not migrate
        assert ro.get("k") == b"v"
    assert not (root / "CACHEDIR.TAG").exists()
    with FileStreamProgramCache(root) as c:
        assert ownership.is_tagged(str(root))
        assert c.get("k") == b"v" and c.max_size_bytes == 10**6
        del c["gone"]
        c["new"] = b"n"
    with FileStreamProgramCache(root) as c:
        assert (c.get("k"), c.get("gone"), c.get("new")) == (b"v", None, b"n")
        c.clear()
        assert len(c) == 0


def test_user_files_inside_a_cache_survive_clear_eviction_and_sweeps(tmp_path) -> None:
    """clear() deleted every regular file in every directory under entries/; the open
    swept any old file in tmp/; closing deleted stats/*.cnt."""
    root = tmp_path / "c"
    FileStreamProgramCache(root).close()
    mine = [
        old_file(root / "entries" / "notes.txt"),
        old_file(root / "entries" / "ab" / "notes.txt"),
        old_file(root / "entries" / "ab" / ("c" * 62 + ".bak")),
        old_file(root / "entries" / "notes" / ("d" * 62)),  # not a shard: not the cache's
        old_file(root / "tmp" / "build.log"),
        old_file(root / "tmp" / "a.b.tmp"),
        old_file(root / "stats" / "x.cnt", b"\0" * 80),
        old_file(root / "locks" / "readme"),
        old_file(root / "README"),
    ]
    (root / "entries" / "cd").mkdir()
    os.mkfifo(root / "entries" / "cd" / "pipe")  # a FIFO at a name that is not an entry's
    kept = {p: p.read_bytes() for p in mine}
    with FileStreamProgramCache(root, max_size_bytes=20_000) as c:
        for i in range(40):  # over the cap: eviction scans and sweeps
            c[f"k{i}"] = bytes([i]) * 1000
        assert c.stats().evictions > 0
        assert c.foreign_objects() == []  # a user's files are not "foreign objects"
        assert not c.remove_foreign_object("notes.txt")
        assert not c.remove_foreign_object("cd/pipe")
        c.clear()
        assert len(c) == 0 and c.size_bytes == 0
    with FileStreamProgramCache(root) as c:  # reopening sweeps and folds again
        assert len(c) == 0
    assert {p: p.read_bytes() for p in mine} == kept
    assert stat.S_ISFIFO((root / "entries" / "cd" / "pipe").lstat().st_mode)


def test_a_read_only_handle_creates_and_deletes_nothing(tmp_path) -> None:
    root = tmp_path / "c"
    with FileStreamProgramCache(root) as c:
        c["k"] = b"v"
        c["bad"] = b"will be damaged"
        bad = Path(c._loc("bad").payload)
    bad.write_bytes(b"WILL be damaged")
    old_file(root / "tmp" / "4242-0badcafe.0.tmp")  # a dead writer's temp: swept when writable
    before = snapshot(root)
    with FileStreamProgramCache(root, read_only=True) as ro:
        assert ro.read_only and ro.get("k") == b"v" and ro.get("bad") is None
        assert ro.stats().integrity_failures == 1  # a miss, left in place
        ro["new"] = b"n"  # dropped, counted
        assert ro.get("new") is None and ro.stats().write_failures == 1
        for destroy in (ro.clear, ro.zero_stats, lambda: ro.remove_entry("0" * 64)):
            with pytest.raises(PermissionError, match="read-only"):
                destroy()
        with pytest.raises(PermissionError):
            del ro["k"]
        with ro.lock("k") as held:
            assert held
        assert len(ro) == 2 and ro.total_stats().stores == 2 and ro.size_bytes > 0
    assert snapshot(root) == before
    missing = tmp_path / "nothing" / "here"
    with FileStreamProgramCache(missing, read_only=True) as ro:  # an empty cache
        assert ro.get("k") is None and len(ro) == 0 and list(ro.iter_entries()) == []
    assert not (tmp_path / "nothing").exists()


def test_a_cache_removed_under_a_live_handle_is_recreated_tagged(tmp_path) -> None:
    """The handle recreated the root untagged: the next opener would have refused it."""
    import shutil

    root = tmp_path / "c"
    with FileStreamProgramCache(root) as c:
        c["a"] = b"1"
        shutil.rmtree(root)
        c["b"] = b"2"
        assert c.get("b") == b"2"
    assert ownership.is_tagged(str(root))
    with FileStreamProgramCache(root) as c:
        assert c.get("b") == b"2"


def _open_together(root: Path, start: threading.Barrier, errors: list[BaseException]) -> None:
    start.wait()
    try:
        FileStreamProgramCache(root).close()
    except BaseException as exc:
        errors.append(exc)


def test_openers_racing_on_a_new_directory_all_accept_it(tmp_path) -> None:
    """A second opener may look while the first is tagging: never 'not a cache'."""
    for round_ in range(100):
        root = tmp_path / f"r{round_}"
        start = threading.Barrier(6)
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=_open_together, args=(root, start, errors)) for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and ownership.is_tagged(str(root))


def test_through_a_read_only_mount_an_older_cache_serves_and_an_empty_folder_is_refused(
    tmp_path,
) -> None:
    """An older cuforge's cache on a read-only mount cannot be tagged: its ledger proves
    it and it serves hits. An empty folder there can be neither tagged nor used."""
    import subprocess

    old, empty = tmp_path / "old", tmp_path / "empty"
    with FileStreamProgramCache(old) as c:
        c["k"] = b"v"
    (old / "CACHEDIR.TAG").unlink()
    empty.mkdir()
    views = []
    try:
        for src in (old, empty):
            view = tmp_path / f"ro-{src.name}"
            view.mkdir()
            bound = subprocess.run(["mount", "--bind", str(src), str(view)], capture_output=True)
            if bound.returncode != 0:
                pytest.skip(f"cannot bind-mount here: {bound.stderr.decode().strip()}")
            views.append(view)
            subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True)
        with FileStreamProgramCache(views[0]) as c:
            assert c.get("k") == b"v"
        with pytest.raises(CachePathError, match="cannot be marked as a cuforge cache"):
            FileStreamProgramCache(views[1])
        with FileStreamProgramCache(views[1], read_only=True) as ro:
            assert len(ro) == 0
    finally:
        for view in views:
            subprocess.run(["umount", "-l", str(view)], check=False)
    assert not (old / "CACHEDIR.TAG").exists() and list(empty.iterdir()) == []
