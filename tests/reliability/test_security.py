"""Security: private caches, who may write them, links below the root, path errors,
keys that look like paths, no pickle, and signed entries on every backend.

The tests run as root here: root passes every permission check when it opens a
file, so these tests check what the cache decides from modes and owners (and give
directories to another uid with ``chown``), not what the kernel would refuse.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import warnings
from pathlib import Path

import pytest

from _backends import FACTORIES, PLAIN
from _figures import SCALES, pick, record
from cuforge.storage import (
    CachePathError,
    CacheWriteWarning,
    FileStreamProgramCache,
    SignedProgramCache,
    UnsafeCacheError,
    entry_id,
)
from cuforge.storage._integrity import SIDECAR_SUFFIX
from cuforge.utils import open_cache

SECRET = b"reliability-secret-0123456789abcdef"
OTHER = b"another-secret-0123456789abcdef!!"
STRANGER = 12345  # a uid that is neither ours nor root
SRC_ROOT = Path(__file__).resolve().parents[2] / "src" / "cuforge"


def mode_of(p: Path | str) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def assert_one_line_naming(exc: BaseException, path: Path | str, *words: str) -> None:
    text = str(exc)
    assert "\n" not in text, text
    assert str(path) in text, text
    for word in words:
        assert word in text, (word, text)


# -- private by default --------------------------------------------------------------------
def test_new_caches_are_private_whatever_the_umask(tmp_path: Path) -> None:
    root = tmp_path / "a" / "cache"
    old = os.umask(0)  # the most permissive umask: modes must not depend on it
    try:
        with FileStreamProgramCache(root, max_size_bytes=10**6) as c:
            c.set_entry(b"k", b"payload", b"meta")
            with c.lock(b"k") as held:
                assert held
                locks = list((root / "locks").iterdir())
                lock_modes = [mode_of(p) for p in locks]
            c.total_stats()
            payload = Path(c._loc(b"k").payload)
    finally:
        os.umask(old)
    dirs = [root.parent, root, payload.parent] + [
        root / d for d in ("entries", "tmp", "stats", "locks")
    ]
    for d in dirs:
        assert mode_of(d) == 0o700, d
    assert lock_modes == [0o600]
    files = [payload, Path(str(payload) + SIDECAR_SUFFIX), root / "size.ledger"]
    files += [p for p in (root / "stats").iterdir()]
    for f in files:
        assert mode_of(f) == 0o600, f
    assert len(files) >= 5


# -- who may write the directories ---------------------------------------------------------
@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o703, 0o722])
def test_a_root_others_can_write_is_refused_with_path_mode_and_fix(tmp_path, mode) -> None:
    root = tmp_path / "cache"
    FileStreamProgramCache(root).close()
    root.chmod(mode)
    with pytest.raises(UnsafeCacheError) as info:
        FileStreamProgramCache(root)
    assert isinstance(info.value, CachePathError) and isinstance(info.value, OSError)
    assert_one_line_naming(info.value, root, f"mode {mode:04o}", "chmod", "trust_shared=True")
    FileStreamProgramCache(root, trust_shared=True).close()  # the documented opt-in
    root.chmod(0o700)
    FileStreamProgramCache(root).close()  # and the fix the message names


@pytest.mark.parametrize("below", ["entries", "tmp", "stats", "locks", "shard"])
def test_any_directory_below_the_root_others_can_write_is_refused(tmp_path, below) -> None:
    root = tmp_path / "cache"
    with FileStreamProgramCache(root) as c:
        c[b"k"] = b"v"
        shard = Path(c._loc(b"k").payload).parent
    target = shard if below == "shard" else root / below
    target.chmod(0o777)
    with pytest.raises(UnsafeCacheError) as info:
        FileStreamProgramCache(root)
    assert_one_line_naming(info.value, target, "writable by every user")


def test_a_group_writable_cache_needs_a_group_mode(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    FileStreamProgramCache(root).close()
    root.chmod(0o770)
    with pytest.raises(UnsafeCacheError) as info:
        FileStreamProgramCache(root)
    assert_one_line_naming(info.value, root, "writable by its group", "mode=0o2770")
    with FileStreamProgramCache(root, mode=0o2770) as c:  # a group cache, said so
        c[b"k"] = b"v"
        assert c.get(b"k") == b"v"


def test_a_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    FileStreamProgramCache(root).close()
    os.chown(root, STRANGER, -1)
    with pytest.raises(UnsafeCacheError) as info:
        FileStreamProgramCache(root)
    assert_one_line_naming(info.value, root, f"owned by uid {STRANGER}", "trust_shared=True")
    os.chown(root, 0, -1)
    os.chown(root / "tmp", STRANGER, -1)
    with pytest.raises(UnsafeCacheError, match="owned by uid"):
        FileStreamProgramCache(root)


def test_in_a_group_cache_members_may_own_directories_of_the_cache_group(tmp_path) -> None:
    group = 54321
    root = tmp_path / "cache"
    with FileStreamProgramCache(root, mode=0o2770) as c:
        c[b"k"] = b"v"
    for d in [root, *root.rglob("*")]:
        if d.is_dir():
            os.chown(d, -1, group)
    os.chown(root / "entries", STRANGER, -1)  # a member created it
    with FileStreamProgramCache(root, mode=0o2770) as c:
        assert c.get(b"k") == b"v"
    os.chown(root / "entries", STRANGER, group + 1)  # ... but in another group
    with pytest.raises(UnsafeCacheError, match="not the cache root's"):
        FileStreamProgramCache(root, mode=0o2770)


def test_a_mode_letting_every_user_write_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="every user"):
        FileStreamProgramCache(tmp_path / "c", mode=0o777)


def test_signed_or_explicitly_trusted_caches_accept_a_shared_directory(tmp_path, monkeypatch):
    root = tmp_path / "shared"
    FileStreamProgramCache(root).close()
    root.chmod(0o777)
    with pytest.raises(UnsafeCacheError):
        open_cache(str(root), secret=None)
    with open_cache(f"file://{root}?trust=shared", secret=None) as c:
        c[b"k"] = b"v"
    with open_cache(str(root), secret=SECRET) as c:  # signed: planted entries never verify
        assert isinstance(c, SignedProgramCache)
        assert c.get(b"k") is None  # the unsigned entry is refused
        c[b"k"] = b"signed"
        assert c.get(b"k") == b"signed"
    with pytest.raises(ValueError, match="trust='yes'"):
        open_cache(f"file://{root}?trust=yes", secret=None)
    # The default cache: CUFORGE_CACHE_SECRET makes a shared default directory usable.
    from cuforge.storage.config import open_default_cache

    monkeypatch.delenv("CUFORGE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    default_root = Path(FileStreamProgramCache().path)
    default_root.chmod(0o777)
    monkeypatch.delenv("CUFORGE_CACHE_SECRET", raising=False)
    with pytest.raises(UnsafeCacheError):
        open_default_cache()
    monkeypatch.setenv("CUFORGE_CACHE_SECRET", SECRET.decode())
    with open_default_cache() as c:
        assert isinstance(c, SignedProgramCache)


def test_an_unsafe_default_cache_warns_and_compiles_uncached(tmp_path, monkeypatch) -> None:
    """compile(cache=True) with a default directory others can write: one warning that
    names the problem, and the program still compiles (no entry is read from there)."""
    from _cache_workers import ARCH, SRC
    from cuforge.compile import Program, ProgramOptions
    from cuforge.storage import config

    for name in ("CUFORGE_CACHE", "CUFORGE_CACHE_SECRET"):
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "open-to-all"
    FileStreamProgramCache(root).close()
    root.chmod(0o777)
    monkeypatch.setenv("CUFORGE_CACHE", str(root))
    monkeypatch.setattr(config, "_current", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        obj = Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=True)
    assert obj.code[:4] == b"\x7fELF"
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWriteWarning)]
    assert len(messages) == 1 and "writable by every user" in messages[0], messages
    monkeypatch.setattr(config, "_current", None)


# -- links below the root ------------------------------------------------------------------
def _outside_with_a_decoy(tmp_path: Path) -> tuple[Path, Path]:
    """A directory outside the cache shaped like ``entries/``, holding a decoy file."""
    outside = tmp_path / "victim"
    (outside / "ab").mkdir(parents=True)
    decoy = outside / "ab" / ("c" * 62)
    decoy.write_bytes(b"the victim's file")
    return outside, decoy


@pytest.mark.parametrize("which", ["entries", "tmp", "locks", "stats"])
def test_a_linked_directory_below_the_root_is_refused_at_open(tmp_path, which) -> None:
    root = tmp_path / "cache"
    with FileStreamProgramCache(root) as c:
        c[b"k"] = b"v"
    outside, _ = _outside_with_a_decoy(tmp_path)
    target = root / which
    subprocess.run(["rm", "-rf", str(target)], check=True)
    target.symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafeCacheError) as info:
        FileStreamProgramCache(root)
    assert_one_line_naming(info.value, target, "symbolic link", "real directory")
    # the cache is named, and what in it is a link: not a "cache directory" of its own
    assert str(info.value).startswith(f"cache directory {root}: its {which}/ is a symbolic link")
    assert info.value.path == str(target)


def test_a_shard_that_is_a_link_at_open_is_a_foreign_object(tmp_path: Path) -> None:
    """A link at a shard's name is not refused at open (it made every command of the
    cache fail): it is never followed -- a miss, a store replaces the link itself --
    listed by ``foreign_objects()`` and removed, never its target."""
    root = tmp_path / "cache"
    with FileStreamProgramCache(root) as c:
        c[b"k"] = b"v"
        c[b"j"] = b"w"
        shard, other = (Path(c._loc(k).payload).parent for k in (b"k", b"j"))
    assert shard != other
    outside, decoy = _outside_with_a_decoy(tmp_path)
    for linked in (shard, other):
        subprocess.run(["rm", "-rf", str(linked)], check=True)
    shard.symlink_to(outside / "ab", target_is_directory=True)
    other.symlink_to(decoy)
    with FileStreamProgramCache(root) as c:
        assert c.get(b"k") is None and c.get(b"j") is None and len(c) == 0
        assert sorted(c.foreign_objects()) == sorted(
            (p.name, "a symbolic link") for p in (shard, other)
        )
        c[b"k"] = b"again"
        assert not shard.is_symlink() and c.get(b"k") == b"again"
        assert c.remove_foreign_object(other.name) and not os.path.lexists(other)
        assert c.foreign_objects() == []
    assert sorted(p.name for p in outside.rglob("*")) == ["ab", "c" * 62]
    assert decoy.read_bytes() == b"the victim's file"


def test_entries_replaced_by_a_link_after_open_is_never_written_listed_or_cleared(tmp_path):
    root = tmp_path / "cache"
    outside, decoy = _outside_with_a_decoy(tmp_path)
    before = sorted(p.relative_to(outside) for p in outside.rglob("*"))
    with FileStreamProgramCache(root, max_size_bytes=4096) as c:
        c[b"k"] = b"v"
        subprocess.run(["rm", "-rf", str(root / "entries")], check=True)
        (root / "entries").symlink_to(outside, target_is_directory=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(20):  # past the cap: eviction scans too
                c[f"key-{i}".encode()] = b"x" * 500
        assert c.stats().write_failures == 20
        assert len([w for w in caught if issubclass(w.category, CacheWriteWarning)]) == 1
        assert len(c) == 0 and list(c.iter_entries()) == []
        c.clear()
        assert c.get(b"k") is None
    assert sorted(p.relative_to(outside) for p in outside.rglob("*")) == before
    assert decoy.read_bytes() == b"the victim's file"


def test_a_shard_or_tmp_replaced_by_a_link_after_open_is_never_written_through(tmp_path):
    root = tmp_path / "cache"
    outside, decoy = _outside_with_a_decoy(tmp_path)
    with FileStreamProgramCache(root) as c:
        c[b"k"] = b"v"
        shard = Path(c._loc(b"k").payload).parent
        subprocess.run(["rm", "-rf", str(shard)], check=True)
        shard.symlink_to(outside / "ab", target_is_directory=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheWriteWarning)
            c[b"k"] = b"again"  # same shard: the link (not its target) is replaced by
            assert not shard.is_symlink() and shard.is_dir()  # a real shard in the root
            assert c.get(b"k") == b"again" and c.stats().write_failures == 0
            c.clear()
            subprocess.run(["rm", "-rf", str(root / "tmp")], check=True)  # (the writer's
            (root / "tmp").symlink_to(outside, target_is_directory=True)  # .alive file too)
            c[b"other"] = b"v"
            assert c.stats().write_failures == 1
    assert sorted(p.name for p in outside.rglob("*")) == ["ab", "c" * 62]
    assert decoy.read_bytes() == b"the victim's file"


@pytest.mark.parametrize("name", ["size.ledger", "evict.lock", "lock file"])
def test_links_at_the_caches_own_files_are_not_followed(tmp_path, name) -> None:
    root = tmp_path / "cache"
    FileStreamProgramCache(root).close()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    dangling = tmp_path / "would-be-created"
    if name == "lock file":
        with FileStreamProgramCache(root) as c:
            lock_path = root / "locks" / (c._loc(b"k").key_digest.hex() + ".lock")
        lock_path.symlink_to(dangling)
    else:
        (root / name).unlink(missing_ok=True)
        (root / name).symlink_to(victim)
    with FileStreamProgramCache(root, max_size_bytes=2048) as c:
        for i in range(10):
            c[f"k{i}".encode()] = b"x" * 400  # ledger updates and eviction scans
        with c.lock(b"k") as held:
            assert held is (name != "lock file")  # a linked lock file cannot be taken
        c.clear()
    assert victim.read_bytes() == b"precious"
    assert not dangling.exists()


def test_a_root_that_is_a_link_is_resolved_once_at_open(tmp_path: Path) -> None:
    real, other = tmp_path / "real", tmp_path / "other"
    FileStreamProgramCache(real).close()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with FileStreamProgramCache(link) as c:
        assert c.path == str(real)
        c[b"k"] = b"v"
        FileStreamProgramCache(other).close()
        link.unlink()
        link.symlink_to(other, target_is_directory=True)  # re-pointed under the handle
        c[b"k2"] = b"v2"
        assert c.get(b"k") == b"v"
    with FileStreamProgramCache(real) as c:
        assert c.get(b"k2") == b"v2"
    with FileStreamProgramCache(other) as c:
        assert c.get(b"k2") is None


# -- path errors ---------------------------------------------------------------------------
def test_path_errors_are_one_line_naming_the_path(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_bytes(b"x")
    cases = {
        Path("/proc/nope"): "cannot be created",
        a_file: "exists and is not a directory",
        a_file / "below": "not a directory",
    }
    for path, words in cases.items():
        with pytest.raises(CachePathError) as info:
            FileStreamProgramCache(path)
        assert_one_line_naming(info.value, path, words)
        assert info.value.path == str(path) and info.value.errno
        with pytest.raises(CachePathError):  # through a URL too
            open_cache(f"file://{path}", secret=None)
    from cuforge.storage import SQLiteProgramCache

    for directory in (Path("/proc/nope"), a_file):  # SQLite: the database's directory
        with pytest.raises(CachePathError) as info:
            SQLiteProgramCache(directory / "cache.db")
        assert_one_line_naming(info.value, directory, "cannot be created")


# -- keys never reach the file system as names ---------------------------------------------
NASTY_KEYS = [
    b"../../../../etc/passwd",
    "/etc/shadow",
    b"..",
    b".",
    b"",
    b"\x00",
    "con:aux\\..\\..\\nul",
    "é" * 300,
    b"x" * 100_000,
    "\n../entries/../../tmp/evil",
]


@SCALES
def test_keys_that_look_like_paths_stay_inside_the_cache(tmp_path: Path, scale: str) -> None:
    import random

    rng = random.Random(15)
    keys = list(NASTY_KEYS)
    for _ in range(pick(scale, 200, 5000)):
        parts = [
            rng.choice(["..", ".", "/", "\\", "\x00", "a", "%2e%2e", "~", "\n"]) for _ in range(12)
        ]
        keys.append("".join(parts).encode("utf-8"))
    keys = list(dict.fromkeys(keys))
    outside_before = sorted(os.listdir(tmp_path))
    root = tmp_path / "cache"
    layout = re.compile(r"entries/[0-9a-f]{2}/[0-9a-f]{62}(\.cfsum)?")
    with FileStreamProgramCache(root) as c:
        for i, key in enumerate(keys):
            c[key] = i.to_bytes(4, "little")
        for i, key in enumerate(keys):
            assert c.get(key) == i.to_bytes(4, "little")
            assert c.remove_entry(entry_id(key if isinstance(key, bytes) else key.encode()))
    assert sorted(os.listdir(tmp_path)) == sorted({*outside_before, "cache"})
    stray = [
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file()
        and str(p.relative_to(root)).startswith("entries/")
        and not layout.fullmatch(str(p.relative_to(root)))
    ]
    assert stray == []
    record(
        "security",
        "filestream",
        "keys shaped like paths (.., /, NUL, 100 kB)",
        len(keys),
        "every entry under entries/<2 hex>/<62 hex>; nothing outside the root",
        scale=scale,
    )


# -- no pickle -----------------------------------------------------------------------------
def test_no_pickle_anywhere_in_the_package() -> None:
    """No serializer that can run code on load is imported anywhere in the package;
    objects that define ``__reduce__`` do so only to refuse pickling."""
    banned = re.compile(
        r"\b(import\s+(c?pickle|dill|shelve|marshal|jsonpickle|cloudpickle)"
        r"|from\s+(c?pickle|dill|shelve|marshal|jsonpickle|cloudpickle)\s+import"
        r"|__import__\(\s*[\"'](c?pickle|marshal)|yaml\.(unsafe_)?load\()"
    )
    found, refusals = [], 0
    sources = [p for p in SRC_ROOT.rglob("*") if p.suffix in (".py", ".c", ".pyx")]
    assert len(sources) > 50
    for p in sources:
        lines = p.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            where = f"{p.relative_to(SRC_ROOT)}:{n + 1}: {line.strip()}"
            if banned.search(line):
                found.append(where)
            # Unpickling is what runs code; objects that define how they are pickled do
            # so to refuse it. (__getstate__ in cli/_pool.py shapes what multiprocessing
            # sends to the CLI's own worker processes: not cache contents, not loaded
            # from anywhere else.)
            if re.search(r"def __(reduce|reduce_ex)__", line):
                if "raise TypeError" not in lines[n + 1]:
                    found.append(where)
                refusals += 1
    assert found == []
    assert refusals >= 1  # the check above does look at these


# -- signed entries on every backend -------------------------------------------------------
@pytest.fixture(params=PLAIN)
def plain(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "memory":
        pytest.skip("memory:// is in-process: nobody else can plant into it (never signed)")
    c = FACTORIES[request.param](tmp_path, request)
    yield request.param, c
    c.close()


def _forgeries(raw, signed: SignedProgramCache, key: bytes, how: str) -> None:
    if how == "unsigned":
        raw.set_entry(key, b"\x7fELF planted", b"")
    elif how == "another secret":
        SignedProgramCache(raw, OTHER).set_entry(key, b"\x7fELF planted", b"meta")
    elif how == "forged signature":
        signed.set_entry(key, b"\x7fELF genuine", b"meta")
        stored = raw.get_entry(key)
        forged = bytearray(stored.meta)
        forged[10] ^= 0x01  # one bit of the MAC
        raw.set_entry(key, stored.data, bytes(forged))
    elif how == "payload swapped":
        signed.set_entry(key, b"\x7fELF genuine", b"meta")
        raw.set_entry(key, b"\x7fELF planted", raw.get_entry(key).meta)
    elif how == "copied from another key":
        signed.set_entry(key + b"-other", b"\x7fELF other", b"meta")
        theirs = raw.get_entry(key + b"-other")
        raw.set_entry(key, theirs.data, theirs.meta)


FORGERIES = ["unsigned", "another secret", "forged signature", "payload swapped",
             "copied from another key"]  # fmt: skip


@SCALES
def test_forged_resigned_and_unsigned_entries_are_never_served(plain, scale: str) -> None:
    name, raw = plain
    signed = SignedProgramCache(raw, SECRET)
    n = pick(scale, 20, 400)
    for how in FORGERIES:
        keys = [f"{how}-{i}".encode() for i in range(n)]
        for key in keys:
            _forgeries(raw, signed, key, how)
        before = signed.stats()
        served = sum(signed.get(key) is not None for key in keys)
        served += sum(signed.get_entry(key) is not None for key in keys)
        after = signed.stats()
        assert served == 0
        assert after.signature_failures - before.signature_failures == 2 * n
        assert after.hits == before.hits
        problems = [signed.check_entry(entry_id(key)) for key in keys]
        assert all(p for p in problems), problems[:3]
        record(
            "security",
            name,
            f"signed cache, entry {how}",
            n,
            "0 served; every lookup a miss counted in signature_failures",
            scale=scale,
        )
        # and the genuine fill replaces each forgery
        for key in keys:
            signed[key] = b"genuine"
        assert all(signed.get(key) == b"genuine" for key in keys)


# -- SQLite: the database and its companion files --------------------------------------------
def test_sqlite_caches_are_private_whatever_the_umask(tmp_path: Path) -> None:
    from cuforge.storage import SQLiteProgramCache

    db = tmp_path / "new" / "cache.db"
    old = os.umask(0)
    try:
        with SQLiteProgramCache(db) as c:
            c[b"k"] = b"v"
            files = sorted(p.name for p in db.parent.iterdir())
            modes = {p.name: mode_of(p) for p in db.parent.iterdir()}
    finally:
        os.umask(old)
    assert mode_of(db.parent) == 0o700
    assert files == ["cache.db", "cache.db-shm", "cache.db-wal", "cache.db.lock"], files
    assert set(modes.values()) == {0o600}, modes


def _sqlite_damage(db: Path, how: str, tmp: Path) -> Path:
    """Make ``db`` unsafe in one way; return the path the refusal must name."""
    if how == "database writable by every user":
        db.chmod(0o666)
    elif how == "database writable by its group":
        db.chmod(0o660)
    elif how == "database owned by another user":
        os.chown(db, STRANGER, -1)
    elif how == "a WAL planted by another user":
        wal = Path(str(db) + "-wal")
        wal.write_bytes(b"")
        os.chown(wal, STRANGER, -1)
        return wal
    elif how == "lock file linked elsewhere":
        lock = Path(str(db) + ".lock")
        lock.unlink(missing_ok=True)
        lock.symlink_to(tmp / "elsewhere")
        return lock
    elif how == "directory writable by every user, not sticky":
        db.parent.chmod(0o777)
        return db.parent
    return db


@pytest.mark.parametrize(
    "how",
    [
        "database writable by every user",
        "database writable by its group",
        "database owned by another user",
        "a WAL planted by another user",
        "lock file linked elsewhere",
        "directory writable by every user, not sticky",
    ],
)
def test_sqlite_files_others_could_write_are_refused(tmp_path: Path, how: str) -> None:
    from cuforge.storage import SQLiteProgramCache

    db = tmp_path / "d" / "cache.db"
    SQLiteProgramCache(db).close()
    named = _sqlite_damage(db, how, tmp_path)
    with pytest.raises(UnsafeCacheError) as info:
        SQLiteProgramCache(db)
    assert_one_line_naming(info.value, named, "fix:")
    if how != "lock file linked elsewhere":  # links are refused whatever the trust
        SQLiteProgramCache(db, trust_shared=True).close()
        with open_cache(f"sqlite://{db}", secret=SECRET) as signed:  # signed: accepted
            signed[b"k"] = b"v"
            assert signed.get(b"k") == b"v"
    assert not (tmp_path / "elsewhere").exists()


def test_sqlite_in_a_sticky_shared_directory_is_accepted(tmp_path: Path) -> None:
    from cuforge.storage import SQLiteProgramCache

    shared = tmp_path / "tmp-like"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: others cannot replace our files
    with SQLiteProgramCache(shared / "cache.db") as c:
        c[b"k"] = b"v"
        assert c.get(b"k") == b"v"
