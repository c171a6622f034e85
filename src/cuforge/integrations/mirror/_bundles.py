"""Bundles: files of a JIT's directory that are valid only together, mirrored as one
entry and hydrated all or nothing.

Numba keeps, per function, an index ``<f>.nbi`` mapping each overload (signature
and target) to a data file ``<f>.<n>.nbc``, ``n`` the first number free in *that
host's* index; a data file does not name its overload. Two hosts' directories so
hold different files under the same names, and per-file entries would let a third
host pair one host's index with another's data -- the wrong overload's code, or
another CPU's -- whenever two publishes interleave. A profile's ``bundle`` (a
regular expression on a file's name with a group ``key``) makes the files of one
folder with the same key one entry: a snapshot of one directory (each file read
whole, and the group's files the same before and after the reads), which hydrate
writes only where none of the group's files stands but the mirror's own unchanged
copies, data files first and the ``head`` (the index) last, taking back what it
wrote when one write fails.

An entry is ``MAGIC``, the manifest's length (4 bytes, big-endian), the manifest
(JSON ``[[name, size, sha256], ...]`` sorted by name) and the files' bytes in that
order. The index lists it as ``<folder>/<key>/`` with the manifest's sha256 -- which
names every file's -- and the entry's size: a publish tells an unchanged group from
the state file without reading it, and a hydrate accepts an entry only when its
manifest hashes to the index's digest and every file to the manifest's sha256.
Names ending in ``/`` are no file path, so an older cuforge refuses them.
cuforge never parses the files themselves (no JIT's pickle is ever loaded).
"""

from __future__ import annotations

import hashlib
import json
import re
import stat
from collections.abc import Callable, Iterable, Mapping

from . import _files

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .profiles import Profile
    from .results import HydrateResult

__all__ = [
    "Unit",
    "digest",
    "held",
    "hydrate",
    "listed",
    "name_of",
    "pack",
    "parse_name",
    "pattern",
    "place",
    "recorded",
    "single",
    "snapshot",
    "units",
    "unpack",
]

#: What is published as one entry: a file, or a bundle's files (path -> version).
Unit = dict[str, _files.Sig]

MAGIC = b"cuforge-mirror-bundle-1\n"
_MANIFEST_LIMIT = 1 << 20


def pattern(value: object, where: str) -> re.Pattern[str]:
    """``value`` compiled, or ValueError (one line, naming ``where``) when it is no
    regular expression or has no group ``key``."""
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected str, got {value!r}")
    try:
        compiled = re.compile(value)
    except re.error as exc:
        raise ValueError(f"{where}: not a regular expression ({exc})") from None
    if "key" not in compiled.groupindex:
        raise ValueError(f"{where}: needs a group (?P<key>...) naming the bundle, got {value!r}")
    return compiled


def name_of(folder: str, key: str) -> str:
    """The index's name of the bundle ``key`` in ``folder``."""
    return f"{folder}/{key}/" if folder else f"{key}/"


def parse_name(name: str) -> tuple[str, str] | None:
    """``(folder, key)`` of a bundle's index name; None when it is not one or leaves
    the directory."""
    if not name.endswith("/") or _files.safe_relpath(name[:-1]) is None:
        return None
    folder, _, key = name[:-1].rpartition("/")
    return folder, key


def _manifest(files: Iterable[tuple[str, int, str]]) -> bytes:
    rows = sorted([name, size, sha] for name, size, sha in files)
    return json.dumps(rows, separators=(",", ":")).encode()


def digest(files: Iterable[tuple[str, int, str]]) -> tuple[str, int]:
    """The index's ``(sha256, size)`` of the bundle of ``files`` (name, size, sha256):
    computed from the state file's records alone, no file read."""
    listed = list(files)
    manifest = _manifest(listed)
    size = len(MAGIC) + 4 + len(manifest) + sum(size for _, size, _ in listed)
    return hashlib.sha256(manifest).hexdigest(), size


def pack(files: list[tuple[str, bytes]]) -> tuple[bytes, str, dict[str, str]]:
    """The entry of ``files`` (name, bytes), its digest, and each file's sha256."""
    shas = {name: hashlib.sha256(data).hexdigest() for name, data in files}
    manifest = _manifest((name, len(data), shas[name]) for name, data in files)
    parts = [MAGIC, len(manifest).to_bytes(4, "big"), manifest]
    parts += [data for _, data in sorted(files)]
    return b"".join(parts), hashlib.sha256(manifest).hexdigest(), shas


def unpack(blob: bytes, want: str) -> list[tuple[str, bytes, str]] | None:
    """The files (name, bytes, sha256) of the entry ``blob`` when its manifest hashes
    to ``want`` and each file to the manifest's sha256; None for anything else."""
    start = len(MAGIC) + 4
    if not blob.startswith(MAGIC) or len(blob) < start:
        return None
    length = int.from_bytes(blob[len(MAGIC) : start], "big")
    manifest = blob[start : start + length]
    if length > _MANIFEST_LIMIT or len(manifest) != length:
        return None
    if hashlib.sha256(manifest).hexdigest() != want:
        return None
    try:
        rows = json.loads(manifest)
    except (ValueError, RecursionError):
        return None
    out: list[tuple[str, bytes, str]] = []
    at = start + length
    for row in rows if isinstance(rows, list) else [None]:
        if not (
            isinstance(row, list)
            and len(row) == 3
            and isinstance(row[0], str)
            and isinstance(row[1], int)
            and isinstance(row[2], str)
            and 0 <= row[1] <= len(blob) - at
        ):
            return None
        data = blob[at : at + row[1]]
        at += row[1]
        if hashlib.sha256(data).hexdigest() != row[2]:
            return None
        out.append((row[0], data, row[2]))
    names = [name for name, _, _ in out]
    return out if at == len(blob) and names and len(set(names)) == len(names) else None


def place(
    root: int,
    folder: str,
    writes: list[tuple[str, bytes]],
    own: Mapping[str, _files.Sig],
) -> dict[str, _files.Sig] | None:
    """Make ``folder``'s group the bundle: move aside the mirror's own copies ``own``
    (name -> the version it wrote), then write ``writes`` in order (the head last),
    each through a temp file linked into place. Returns what was written, or None
    when a file of the group changed or appeared meanwhile (the JIT's): then the
    other moved copies are put back and nothing written stays (all or nothing).

    Closes the race of the JIT writing the group while the mirror does: a link never
    replaces a name, so the JIT's file is kept and the mirror's half of the group
    goes, proven its own; the older copies moved aside are removed once the group is
    written, or when a write failed (the JIT is rebuilding the group)."""

    def rel(name: str) -> str:
        return _join(folder, name)

    aside: dict[str, str] = {}
    placed: dict[str, _files.Sig] = {}
    try:
        for name, sig in own.items():
            try:
                moved = _files.take_aside(root, rel(name), sig)
            except FileNotFoundError:  # removed meanwhile: the group changed
                moved = None
            if moved is None:  # the JIT's file now: the group is its own again
                for back, tmp in aside.items():
                    _files.put_back(root, rel(back), tmp, own[back])
                aside.clear()
                return None
            aside[name] = moved
        for name, data in writes:
            wrote = _files.write_new(root, rel(name), data)
            if wrote is None:
                return None
            placed[name] = wrote
        done, placed = placed, {}
        return done
    finally:
        _files.drop_own(root, folder, {tmp: own[name] for name, tmp in aside.items()})
        _files.drop_own(root, folder, placed)


# -- the engine's side: what a bundle is in a directory ---------------------------------
def units(files: Mapping[str, _files.Sig], profile: Profile, started_ns: int) -> dict[str, Unit]:
    """``files`` by the entry each is published in: its own (named by its path), or
    its bundle's (``folder/key/``: every file of the group). A ``new_only`` profile
    keeps the units with a file changed since ``started_ns`` (the change time, which
    ``utime`` cannot set back)."""
    out: dict[str, Unit] = {}
    for rel, sig in files.items():
        folder, _, name = rel.rpartition("/")
        found = profile.bundle_of(name)
        out.setdefault(rel if found is None else name_of(folder, found[0]), {})[rel] = sig
    if profile.new_only:
        out = {n: unit for n, unit in out.items() if any(s[2] >= started_ns for s in unit.values())}
    return out


def listed(profile: Profile, name: str) -> bool:
    """Whether the index's ``name`` is a bundle ``profile`` hydrates."""
    return (
        profile.bundle is not None
        and parse_name(name) is not None
        and not profile.skipped(name[:-1])
    )


def belongs(profile: Profile, key: str) -> Callable[[str], bool]:
    """Whether a file's name is one of the bundle ``key``'s group (and mirrored)."""

    def test(name: str) -> bool:
        found = profile.bundle_of(name)
        return (
            found is not None
            and found[0] == key
            and not profile.skipped(name)
            and profile.included(name)
        )

    return test


def recorded(name: str, unit: Unit, known: Mapping[str, list[Any] | None]) -> str:
    """The sha256 the index lists for ``unit`` (all of whose files the state file
    ``known`` records): a file's own, a bundle's manifest's (from each file's)."""
    if not name.endswith("/"):
        return str((known[name] or ["", "", "", "", ""])[4])
    files = [(rel.rpartition("/")[2], unit[rel][0], str(k[4])) for rel, k in known.items() if k]
    return digest(files)[0]


def held(root: int, name: str, sha: str, profile: Profile, state: Mapping[str, list[Any]]) -> int:
    """How many files of the bundle ``name`` (listed with ``sha``) the directory holds
    as the state file recorded them, when it holds exactly that bundle (nothing to
    fetch); else 0."""
    folder, key = parse_name(name) or ("", "")
    try:
        local = _files.listing(root, folder, belongs(profile, key))
    except OSError:
        return 0
    unit = {_join(folder, n): _files.sig_of(st) for n, st in local.items()}
    known = {rel: state.get(rel) for rel in unit}
    if not unit or any(k is None or tuple(k[:4]) != unit[rel] for rel, k in known.items()):
        return 0
    return len(unit) if recorded(name, unit, known) == sha else 0


def single(
    root: int, rel: str, sig: _files.Sig, limit: int
) -> tuple[bytes, str, dict[str, str]] | None:
    """A file's own entry: its bytes, sha256, and that sha256 by its path; None when
    it is no longer the version ``sig`` or cannot be read whole."""
    got = _files.read_whole(root, rel, limit)
    if got is None or got[1] != sig:
        return None
    sha = hashlib.sha256(got[0]).hexdigest()
    return got[0], sha, {rel: sha}


def snapshot(
    root: int, name: str, unit: Unit, profile: Profile, limit: int
) -> tuple[bytes, str, dict[str, str]] | None:
    """The entry of the bundle ``name`` whose files are ``unit``: its bytes, digest,
    and each file's sha256 by path; None when a file changed meanwhile. Each file is
    read whole, and the group must be ``unit`` after every read as before: the entry
    is one state the directory had, never files from two."""
    folder, key = parse_name(name) or ("", "")
    read: list[tuple[str, bytes]] = []
    for rel, sig in sorted(unit.items()):
        got = _files.read_whole(root, rel, limit)
        if got is None or got[1] != sig:
            return None
        read.append((rel.rpartition("/")[2], got[0]))
    try:
        now = _files.listing(root, folder, belongs(profile, key))
    except OSError:
        return None
    if {_join(folder, n): _files.sig_of(st) for n, st in now.items()} != unit:
        return None
    data, sha, shas = pack(read)
    return data, sha, {_join(folder, n): s for n, s in shas.items()}


def hydrate(
    root: int,
    name: str,
    files: list[tuple[str, bytes, str]] | None,
    profile: Profile,
    state: dict[str, list[Any]],
    out: HydrateResult,
    local_sha: Callable[[int, str, _files.Sig], str | None],
) -> bool:
    """Make the group ``name`` the bundle's ``files`` (as :func:`unpack` verified
    them; None: they did not verify), only where every file of the group standing is
    the same bytes (``local_sha``) or the mirror's own unchanged copy (``state``):
    then all of it, the head last, or nothing (:func:`place`). A group with any other
    file is the JIT's and is kept. True when the whole bundle was there already."""
    folder, key = parse_name(name) or ("", "")
    test = belongs(profile, key)
    if not files or not all(
        "/" not in n and _files.safe_relpath(n) == n and test(n) for n, _, _ in files
    ):
        out.verified_failures += 1
        return False
    want = {n: (data, sha) for n, data, sha in files}
    try:
        local = _files.listing(root, folder, test)
    except OSError:  # a link or a file where the folder should be
        out.skipped_other += len(want)
        return False
    same: list[str] = []
    own: dict[str, _files.Sig] = {}
    for n, st in sorted(local.items()):
        rel, sig, have = _join(folder, n), _files.sig_of(st), want.get(n)
        mine = state.get(rel)
        if not stat.S_ISREG(st.st_mode):
            out.skipped_other += len(want)
            return False
        if have and mine is not None and tuple(mine[:4]) == sig and mine[4] == have[1]:
            same.append(n)
        elif have and st.st_size == len(have[0]) and local_sha(root, rel, sig) == have[1]:
            same.append(n)
            state[rel] = [*sig, have[1], 0]
        elif mine is not None and tuple(mine[:4]) == sig and mine[5]:
            own[n] = sig  # the mirror's own copy, of an older bundle
        else:
            out.skipped_newer += len(want)
            return False
    out.present += len(same)
    writes = sorted(
        (n for n in want if n not in same),
        key=lambda n: ((profile.bundle_of(n) or ("", False))[1], n),
    )
    if not writes and not own:
        return True
    placed = place(root, folder, [(n, want[n][0]) for n in writes], own)
    if placed is None:
        out.skipped_newer += len(writes)
        return False
    for n in own:
        state.pop(_join(folder, n), None)
    for n, sig in placed.items():
        state[_join(folder, n)] = [*sig, want[n][1], 1]
    out.written += len(placed)
    out.replaced += len(own.keys() & placed.keys())
    return False


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name
