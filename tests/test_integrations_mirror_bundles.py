"""The directory mirror's bundles: files a JIT keeps valid only together (Numba's index
``<f>.nbi`` and the data files ``<f>.<n>.nbc`` it names by a number each host picks)
travel as one entry, so no host gets one host's index with another's data.

Real numba 0.68 processes (``cache=True`` on the CPU; skipped where numba is not
installed: ``make test-jit``) on a shared FileStream cache, each "host" its own
``NUMBA_CACHE_DIR`` and the same source at one absolute path; the test process plays
``cuforge run`` (hydrate, periodic looks, the last publish). The engine's bundle rules
are tested on plain files too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cuforge.integrations._cache import ForeignEntries
from cuforge.integrations.mirror import PROFILES, Mirror, Profile, load_profiles
from cuforge.storage.base import ProgramCacheResource
from cuforge.storage.filestream import FileStreamProgramCache
from cuforge.storage.memory import InMemoryProgramCache

#: One function, two overloads whose results tell them apart: 2**53 + 1 is exact in
#: int64 and rounds in float64, so the float64 overload's code called for an int
#: returns 2.0**54 (a float), the int64 overload's 2**54 + 3.
JOB = """
import json, sys
from numba import njit

@njit(cache=True)
def f(x):
    return x * 2 + 1

ARGS = {"int64": 2**53 + 1, "float64": 2.5}
out = {kind: [f(ARGS[kind]), type(f(ARGS[kind])).__name__] for kind in sys.argv[1:]}
out["hits"] = sum(f.stats.cache_hits.values())
out["misses"] = sum(f.stats.cache_misses.values())
print(json.dumps(out))
"""
INT64 = [2**54 + 3, "int"]
FLOAT64 = [6.0, "float"]
#: Numba's names, as the numba profile bundles them.
NUMBA_BUNDLE = r"(?P<key>.+)\.(?:(?P<head>nbi)|[0-9]+\.nbc)"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """The job's source at one absolute path every "host" uses (numba names a source
    directory's cache folder by a hash of that path)."""
    pytest.importorskip("numba")
    src = tmp_path / "src"
    src.mkdir()
    (src / "overloads.py").write_text(JOB)
    return src / "overloads.py"


def run_job(script: Path, numba_dir: Path, *kinds: str) -> dict[str, Any]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    proc = subprocess.run(
        [sys.executable, str(script), *kinds],
        env={**base, "NUMBA_CACHE_DIR": str(numba_dir)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def host(cache: ProgramCacheResource, numba_dir: Path) -> Mirror:
    m = Mirror(PROFILES["numba"], cache, env={"NUMBA_CACHE_DIR": str(numba_dir)}, settle_s=0.2)
    assert m.active, m.reason
    return m


def test_a_host_never_gets_an_index_with_another_hosts_data_files(
    script: Path, tmp_path: Path
) -> None:
    # Host A calls f(int64): its index maps int64 to f.1.nbc. Host B calls f(float64):
    # its index maps float64 to f.1.nbc -- the same name, other code.
    cache = FileStreamProgramCache(tmp_path / "shared")
    a, b, c, d = (tmp_path / n for n in ("a", "b", "c", "d"))
    assert run_job(script, a, "int64")["int64"] == INT64
    assert host(cache, a).publish().errors == 0
    mirror_b = host(cache, b)
    assert run_job(script, b, "float64")["float64"] == FLOAT64
    mirror_b.publish(wait=False)  # a periodic look: B's files seen for the first time
    # B's job calls f(int64) later: numba rewrites B's index (float64 -> 1, int64 -> 2)
    # and writes f.2.nbc; B's f.1.nbc (float64's code) is unchanged since that look.
    assert run_job(script, b, "int64")["int64"] == INT64
    mirror_b.publish(wait=False)  # the next look (before: B's f.1.nbc published alone)
    # A fresh host hydrates now and calls f(int64): it must run int64's code.
    host(cache, c).hydrate()
    got = run_job(script, c, "int64")
    assert got["int64"] == INT64  # before: 1.8014398509481984e16, B's float64 code
    assert (got["hits"], got["misses"]) == (1, 0)  # A's index and A's data
    # B's job ends (its last publish): a fresh host then gets B's state, both hit.
    assert mirror_b.stop().errors == 0
    host(cache, d).hydrate()
    both = run_job(script, d, "int64", "float64")
    assert (both["int64"], both["float64"], both["hits"], both["misses"]) == (
        INT64,
        FLOAT64,
        2,
        0,
    )


class _Racing(FileStreamProgramCache):
    """A FileStream cache that runs ``first`` before its first store: another host's
    publish landing between this one's look at the index and its stores (jobs of one
    fleet ending at the same moment)."""

    first: Callable[[], object] | None = None

    def set_entry(self, key: Any, value: Any, meta: bytes = b"") -> Any:
        first, self.first = self.first, None
        if first is not None:
            first()
        return super().set_entry(key, value, meta)


def test_two_publishes_at_once_never_pair_an_index_with_another_hosts_data(
    script: Path, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    a, b, c, d = (tmp_path / n for n in ("a", "b", "c", "d"))
    run_job(script, a, "int64")
    host(FileStreamProgramCache(shared), a).publish()
    # C hydrated A's files (int64 -> f.1.nbc), then called f(float64): its index now
    # maps int64 -> 1 and float64 -> 2, and f.1.nbc is still the one A published.
    racing = _Racing(shared)
    mirror_c = host(racing, c)
    mirror_c.hydrate()
    assert run_job(script, c, "float64")["float64"] == FLOAT64
    # B, a fresh host, called f(float64) only: float64 -> f.1.nbc, other code.
    run_job(script, b, "float64")
    # C's publish reads the index (A's f.1.nbc, the same bytes as C's: not stored
    # again); B's publish lands before C stores its own.
    racing.first = lambda: host(FileStreamProgramCache(shared), b).publish()
    mirror_c.publish()
    host(FileStreamProgramCache(shared), d).hydrate()
    got = run_job(script, d, "int64", "float64")
    assert got["int64"] == INT64  # before: C's index with B's f.1.nbc, float64's code
    assert got["float64"] == FLOAT64


# -- bundles on plain files ---------------------------------------------------------------
def mirror(cache: ProgramCacheResource, directory: Path, **kw: Any) -> Mirror:
    kw.setdefault("version", "nb==1")
    kw.setdefault("settle_s", 0.05)
    profile = kw.pop("profile", None) or Profile(
        name="nb", env=("NB_DIR",), gpu_dependent=False, bundle=NUMBA_BUNDLE
    )
    return Mirror(profile, cache, directory, **kw)


def files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".cuforge-mirror")
    }


def write(root: Path, tree: dict[str, bytes]) -> None:
    """Each file written by rename, as numba does."""
    for rel, data in tree.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_name(path.name + ".tmp.1").write_bytes(data)
        os.replace(path.with_name(path.name + ".tmp.1"), path)


A = {"m/f-3.py311.nbi": b"A: int64 -> 1", "m/f-3.py311.1.nbc": b"A: int64 code"}
B = {"m/f-3.py311.nbi": b"B: flt64 -> 1", "m/f-3.py311.1.nbc": b"B: flt64 code"}  # A's sizes


def test_a_bundle_is_one_entry_hydrated_whole(tmp_path: Path) -> None:
    cache = InMemoryProgramCache()
    a, b = tmp_path / "a", tmp_path / "b"
    write(a, {**A, "m/g-9.py311.nbi": b"g index", "m/g-9.py311.1.nbc": b"g code", "x.o": b"x"})
    published = mirror(cache, a).publish()
    assert (published.stored, published.pending) == (5, 0)  # files, in 3 entries
    m = mirror(cache, a)
    index = json.loads(ForeignEntries(cache, "mirror-index").load(m.prefix) or b"")
    assert sorted(index["files"]) == ["m/f-3.py311/", "m/g-9.py311/", "x.o"]
    got = mirror(cache, b).hydrate()
    assert (got.written, got.verified_failures, got.missing) == (5, 0, 0)
    assert files(b) == files(a)
    again = mirror(cache, a).publish()  # nothing changed: nothing read or stored
    assert (again.stored, again.unchanged) == (0, 5)
    assert mirror(cache, b).hydrate().present == 5


def test_a_group_that_changed_between_looks_is_not_published_in_part(tmp_path: Path) -> None:
    cache, a = InMemoryProgramCache(), tmp_path / "a"
    write(a, A)
    mirror(cache, a).publish()
    b = tmp_path / "b"
    m = mirror(cache, b)
    write(b, B)
    assert m.publish(wait=False).pending == 2  # first look
    # The JIT adds an overload: a new index and f.2.nbc; f.1.nbc is the same file.
    write(b, {"m/f-3.py311.nbi": b"B: float64 -> 1, int64 -> 2", "m/f-3.py311.2.nbc": b"B i"})
    look = m.publish(wait=False)
    assert (look.stored, look.pending) == (0, 3)  # before: B's f.1.nbc stored alone
    assert files_of(cache, tmp_path / "c") == A
    done = m.publish(wait=False)
    assert (done.stored, done.pending) == (3, 0)
    assert files_of(cache, tmp_path / "d") == files(b)


def files_of(cache: ProgramCacheResource, where: Path) -> dict[str, bytes]:
    mirror(cache, where).hydrate()
    return files(where)


def test_a_group_is_hydrated_all_or_nothing(tmp_path: Path) -> None:
    cache, a = InMemoryProgramCache(), tmp_path / "a"
    write(a, A)
    mirror(cache, a).publish()
    # The JIT's own file of the group stands: nothing of the group is written.
    for i, own in enumerate(("m/f-3.py311.nbi", "m/f-3.py311.1.nbc", "m/f-3.py311.7.nbc")):
        b = tmp_path / f"b{i}"
        write(b, {own: b"the JIT's own"})
        got = mirror(cache, b).hydrate()
        assert (got.written, got.skipped_newer) == (0, 2), own
        assert files(b) == {own: b"the JIT's own"}
    # The group's files already there, the same bytes: present, nothing written.
    c = tmp_path / "c"
    write(c, A)
    assert (mirror(cache, c).hydrate().present, files(c)) == (2, A)


def test_the_mirrors_own_group_is_replaced_whole_and_only_while_unchanged(
    tmp_path: Path,
) -> None:
    cache, a, b, c = InMemoryProgramCache(), tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write(a, A)
    mirror(cache, a).publish()
    assert mirror(cache, b).hydrate().written == 2
    assert mirror(cache, c).hydrate().written == 2
    # A's index is rebuilt: f.1.nbc goes, f.2.nbc comes.
    newer = {"m/f-3.py311.nbi": b"A: int64 -> 2", "m/f-3.py311.2.nbc": b"A: int64 code v2"}
    os.unlink(a / "m/f-3.py311.1.nbc")
    write(a, newer)
    assert mirror(cache, a).publish().stored == 2
    got = mirror(cache, b).hydrate()  # b's group is the mirror's own, unchanged
    assert (got.written, got.replaced, got.skipped_newer) == (2, 1, 0)
    assert files(b) == newer  # the older group's f.1.nbc went with it
    assert sorted(p.name for p in (b / "m").iterdir()) == ["f-3.py311.2.nbc", "f-3.py311.nbi"]
    # On c the JIT rewrote the index since the mirror wrote it: the group is kept.
    write(c, {"m/f-3.py311.nbi": b"c: int64 -> 1, float64 -> 2"})
    before = files(c)
    got = mirror(cache, c).hydrate()
    assert (got.written, got.skipped_newer) == (0, 2) and files(c) == before


def test_a_failed_write_leaves_none_of_the_group(tmp_path: Path) -> None:
    # The race a bundle's write closes: the JIT writes the index between the mirror's
    # look and its link. The data file the mirror had placed goes again.
    from cuforge.integrations.mirror import _bundles, _files

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "f.nbi").write_bytes(b"the JIT's index")
    root = _files.open_root(str(tmp_path))
    try:
        placed = _bundles.place(root, "m", [("f.1.nbc", b"data"), ("f.nbi", b"index")], {})
    finally:
        os.close(root)
    assert placed is None
    assert files(tmp_path) == {"m/f.nbi": b"the JIT's index"}
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["f.nbi"]


def test_entries_of_bundled_files_are_never_hydrated_one_by_one(tmp_path: Path) -> None:
    # An older cuforge published numba's files one by one; a bundling hydrate
    # refuses them (they may be two hosts' files), and writes nothing.
    cache, a, b = InMemoryProgramCache(), tmp_path / "a", tmp_path / "b"
    write(a, A)
    plain = Profile(name="nb", env=("NB_DIR",), gpu_dependent=False)
    assert mirror(cache, a, profile=plain).publish().stored == 2
    got = mirror(cache, b).hydrate()
    assert (got.written, got.refused) == (0, 2) and files(b) == {}


def test_a_tampered_or_replaced_bundle_is_never_written(tmp_path: Path) -> None:
    cache, a = InMemoryProgramCache(), tmp_path / "a"
    write(a, A)
    m = mirror(cache, a)
    m.publish()
    key = ForeignEntries(cache, "mirror").key(f"{m.prefix}:m/f-3.py311/")
    genuine = cache.get_entry(key)
    # Another host's bundle, landed under the name after the index listed A's.
    elsewhere = InMemoryProgramCache()
    write(tmp_path / "other", B)
    mirror(elsewhere, tmp_path / "other").publish()
    others = elsewhere.get_entry(key)
    assert genuine is not None and others is not None
    assert len(others.data) == len(genuine.data)  # only the index's digest tells them apart
    data = bytes(genuine.data)
    for i, (forged, meta) in enumerate(
        (
            (bytes(others.data), others.meta),
            (data.replace(b"A: int64 code", b"A: int64 cod3"), genuine.meta),  # a member's byte
            (data[:-1], genuine.meta),
            (b"not a bundle", genuine.meta),
        )
    ):
        cache.set_entry(key, forged, meta)
        got = mirror(cache, tmp_path / f"b{i}").hydrate()
        assert (got.written, got.verified_failures) == (0, 1), i
        assert files(tmp_path / f"b{i}") == {}


def test_a_bundle_with_a_file_changed_in_place_is_never_published(tmp_path: Path) -> None:
    cache, a = InMemoryProgramCache(), tmp_path / "a"
    write(a, A)
    assert mirror(cache, a).publish().stored == 2
    write(a, {"m/f-3.py311.nbi": b"A: int64 -> 1, float64 -> 2", "m/f-3.py311.2.nbc": b"f64"})
    with open(a / "m/f-3.py311.1.nbc", "r+b") as f:  # the same inode: not numba's way
        f.write(b"PLANTED")
    later = mirror(cache, a).publish()
    assert (later.tampered, later.stored) == (3, 0)  # the whole group, not its other files
    assert files_of(cache, tmp_path / "b") == A


def test_a_snapshot_is_one_state_of_the_group(tmp_path: Path) -> None:
    # A file of the group that appears after the look (numba writing f.5.nbc) makes
    # the files read no one state the directory had: nothing is made of them.
    from cuforge.integrations.mirror import _bundles, _files

    write(tmp_path, A)
    profile = Profile(name="nb", env=("NB_DIR",), gpu_dependent=False, bundle=NUMBA_BUNDLE)
    root = _files.open_root(str(tmp_path))
    try:
        looked = _bundles.units(_files.scan(root, profile.skipped, None)[0], profile, 0)
        assert list(looked) == ["m/f-3.py311/"]
        unit = looked["m/f-3.py311/"]
        got = _bundles.snapshot(root, "m/f-3.py311/", unit, profile, 1 << 20)
        assert got is not None and _bundles.unpack(got[0], got[1]) is not None
        write(tmp_path, {"m/f-3.py311.5.nbc": b"written after the look"})
        assert _bundles.snapshot(root, "m/f-3.py311/", unit, profile, 1 << 20) is None
    finally:
        os.close(root)


def test_bundles_are_listed_and_verified_by_the_cli(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'fs'}"
    write(tmp_path / "a", A)
    mirror(FileStreamProgramCache(tmp_path / "fs"), tmp_path / "a").publish()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "cuforge", "cache", *args, "--cache", url]
        return subprocess.run(cmd, capture_output=True, text=True)

    ls = cli("ls", "--json")
    assert ls.returncode == 0, ls.stderr
    rows = json.loads(ls.stdout)
    rows = rows["entries"] if isinstance(rows, dict) else rows
    assert ("mirror", "nb:m/f-3.py311/") in {(r["kind"], r["name"]) for r in rows}
    verify = cli("verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_bad_bundle_setting_is_one_line_naming_it() -> None:
    good = load_profiles({"x": {"env": ["X"], "dists": ["x"], "bundle": r"(?P<key>.+)\.i"}})
    assert good["x"].bundle == r"(?P<key>.+)\.i"
    for value, message in (
        ("(", r"^mirror\.x\.bundle: not a regular expression"),
        (r"(.+)\.i", r"^mirror\.x\.bundle: .*\(\?P<key>"),
        (5, r"^mirror\.x\.bundle: expected str"),
    ):
        with pytest.raises(ValueError, match=message) as err:
            load_profiles({"x": {"env": ["X"], "dists": ["x"], "bundle": value}})
        assert "\n" not in str(err.value)
    assert PROFILES["numba"].bundle  # numba's index and data files travel together
