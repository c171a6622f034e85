"""Header manifests: which header versions produced which cache entry, checked cheaply.

A manifest is a ``manifest`` record (``cuforge.storage.record``) stored as an
ordinary cache entry under a key that covers everything but the headers (the
source, flags, compiler, include directories by position). It lists up to
``MAX_VARIANTS`` variants, newest first; each names the entry key of one compile
and what that compile read::

    {"key": "<hex entry key>", "t": <ns, before the files were looked at>,
     "files":  [[pos, rel, digest, size, mtime_ns, ino, ctime_ns], ...],
     "absent": [[pos, rel, witness], ...],
     "dirs":   [[pos, rel, ino, mtime_ns, ctime_ns], ...]}

``pos`` is a search position (``S`` source directory, ``C`` working directory,
``0``, ``1``... include_path entries, ``A`` absolute) and ``rel`` a name relative
to it, so two checkouts at different roots share manifests and entries.

A variant holds when every file has its recorded content and every absent
candidate is still absent. Content is compared by digest. Shortcuts, each taken
only for what was already older than ``RACY_NS`` when recorded (an edit within a
file system's timestamp granularity could otherwise leave the stat unchanged):
a file whose stat (size, mtime, inode, ctime) is unchanged has its recorded
content; an absent candidate whose *witness* -- the deepest directory of its path
that existed, stated before the absence was confirmed -- is unchanged is still
absent (creating, renaming or deleting an entry changes a directory's mtime and
ctime). A per-process memo keeps digests of files read here, and
:mod:`._watch` lets a validated variant stand without any stat until an event.
"""

from __future__ import annotations

import os
import stat as stat_mod
import threading
import time
from collections import OrderedDict
from typing import Any, Generic, NamedTuple, TypeVar

from cuforge.compile._includes import ABSOLUTE, DepSet, Roots, file_digest
from cuforge.storage.record import decode_record, encode_record

__all__ = [
    "MAX_VARIANTS",
    "Prepared",
    "Problem",
    "add_variant",
    "check",
    "decode",
    "prepare",
]

MAX_VARIANTS = 8
RACY_NS = 2_000_000_000  # covers every common file system's timestamp granularity
_MEMO_MAX = 4096

_StatKey = tuple[int, int, int, int]


class Problem(NamedTuple):
    """Why a variant does not hold: "edited", "deleted", "shadowed", or "moved" (an
    include directory position that does not exist any more)."""

    what: str
    path: str
    detail: str = ""

    def __str__(self) -> str:
        if self.what == "shadowed":
            return f"header {self.path} now exists and shadows {self.detail}"
        if self.what == "moved":
            return f"include directory {self.detail} is not given any more"
        return f"header {self.path} {self.what}"


class Prepared(NamedTuple):
    """A variant resolved against this process's search roots, ready to check."""

    key: bytes
    files: tuple[tuple[str, _StatKey | None, str], ...]  # path, trusted stat, digest
    groups: tuple[tuple[str | None, tuple[int, int, int] | None, tuple[str, ...]], ...]
    problems: tuple[Problem, ...]  # found while preparing (a position that is gone)
    watch_files: tuple[str, ...]
    watch_dirs: tuple[str, ...]


# -- per-process memos ---------------------------------------------------------------------
_K = TypeVar("_K")
_V = TypeVar("_V")


class _Memo(Generic[_K, _V]):
    def __init__(self, limit: int) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[_K, _V] = OrderedDict()
        self._limit = limit

    def get(self, key: _K) -> _V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: _K, value: _V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            if len(self._items) > self._limit:
                self._items.popitem(last=False)


# path -> (stat key, digest), for files older than RACY_NS
_digests: _Memo[str, tuple[_StatKey, str]] = _Memo(_MEMO_MAX)
_decoded: _Memo[bytes, dict[str, Any]] = _Memo(256)  # manifest bytes -> decoded record
_prepared: _Memo[tuple[bytes, Roots], list[Prepared]] = _Memo(256)  # (bytes, roots) -> [Prepared]


def _stat_key(st: os.stat_result) -> _StatKey:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def _old(mtime_ns: int, ctime_ns: int, at_ns: int) -> bool:
    return mtime_ns <= at_ns - RACY_NS and ctime_ns <= at_ns - RACY_NS


def _current_digest(path: str, st: os.stat_result) -> str | None:
    """The digest of the file at ``path`` (None: unreadable)."""
    key = _stat_key(st)
    known = _digests.get(path)
    if known is not None and known[0] == key:
        return known[1]
    now = time.time_ns()
    try:
        with open(path, "rb") as f:
            content = f.read()
            after = _stat_key(os.fstat(f.fileno()))
    except OSError:
        return None
    digest = file_digest(content)
    if after == key and _old(key[1], key[3], now):
        _digests.put(path, (key, digest))
    return digest


# -- decoding and preparing ----------------------------------------------------------------
def _ints(row: list[Any], start: int) -> bool:
    return all(isinstance(x, int) and not isinstance(x, bool) for x in row[start:])


def _valid_variant(v: Any) -> bool:
    try:
        return (
            isinstance(v["key"], str)
            and isinstance(v["t"], int)
            and all(len(r) == 7 and _ints(r, 3) and all(isinstance(x, str) for x in r[:3])
                    for r in v["files"])
            and all(len(r) == 3 and isinstance(r[0], str) and isinstance(r[1], str)
                    and isinstance(r[2], int) and -1 <= r[2] < len(v["dirs"])
                    for r in v["absent"])
            and all(len(r) == 5 and isinstance(r[0], str) and isinstance(r[1], str)
                    and _ints(r, 2) for r in v["dirs"])
        )  # fmt: skip
    except (KeyError, TypeError):
        return False


def decode(data: bytes | None) -> dict[str, Any] | None:
    """The manifest in ``data``; None when it is not a well-formed one."""
    if not data:
        return None
    found = _decoded.get(data)
    if found is not None:
        return found
    record = decode_record(data, "manifest")
    if (
        record is None
        or not isinstance(record.get("variants"), list)
        or not all(_valid_variant(v) for v in record["variants"])
    ):
        return None
    _decoded.put(data, record)
    return record


def prepare(data: bytes, record: dict[str, Any], roots: Roots) -> list[Prepared]:
    """Every variant of ``record`` resolved against ``roots`` (memoised per process)."""
    memo_key = (data, roots)
    found = _prepared.get(memo_key)
    if found is not None:
        return found
    out = [_prepare_one(v, roots) for v in record["variants"]]
    _prepared.put(memo_key, out)
    return out


def _prepare_one(v: dict[str, Any], roots: Roots) -> Prepared:
    t = v["t"]
    problems: list[Problem] = []
    files = []
    for pos, rel, digest, size, mtime_ns, ino, ctime_ns in v["files"]:
        path = roots.path(pos, rel)
        if path is None:
            problems.append(Problem("moved", rel, f"#{pos}"))
            continue
        trusted = (size, mtime_ns, ino, ctime_ns) if _old(mtime_ns, ctime_ns, t) else None
        files.append((path, trusted, digest))
    dirs = []
    for pos, rel, ino, mtime_ns, ctime_ns in v["dirs"]:
        path = roots.path(pos, rel)
        trusted_dir = (ino, mtime_ns, ctime_ns) if _old(mtime_ns, ctime_ns, t) else None
        dirs.append((path, trusted_dir))
    grouped: dict[int, list[str]] = {}
    for pos, rel, w in v["absent"]:
        path = roots.path(pos, rel)
        if path is not None:  # a position that no longer exists holds no file
            grouped.setdefault(w, []).append(path)
    groups = []
    for w, candidates in sorted(grouped.items()):
        witness, trusted_dir = dirs[w] if w >= 0 else (None, None)
        groups.append((witness, trusted_dir, tuple(candidates)))
    watch_dirs = [g[0] for g in groups if g[0] is not None]
    if any(g[0] is None for g in groups):
        watch_dirs = []  # a candidate without a witness can only be checked by stat
    return Prepared(
        bytes.fromhex(v["key"]),
        tuple(files),
        tuple(groups),
        tuple(problems),
        tuple(f[0] for f in files),
        tuple(watch_dirs),
    )


# -- checking ----------------------------------------------------------------------------
def check(p: Prepared, all_problems: bool = False) -> list[Problem]:
    """What stops the prepared variant from holding here and now (empty: it holds).

    Stops at the first problem unless ``all_problems``.
    """
    problems = list(p.problems)
    if problems and not all_problems:
        return problems
    for path, trusted, digest in p.files:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            problems.append(Problem("deleted", path))
        else:
            if not stat_mod.S_ISREG(st.st_mode):
                problems.append(Problem("deleted", path))
            elif _stat_key(st) != trusted and _current_digest(path, st) != digest:
                problems.append(Problem("edited", path))
        if problems and not all_problems:
            return problems
    for witness, trusted_dir, candidates in p.groups:
        if witness is not None and trusted_dir is not None:
            try:
                st = os.stat(witness)
                if (st.st_ino, st.st_mtime_ns, st.st_ctime_ns) == trusted_dir:
                    continue
            except (OSError, ValueError):
                pass
        for path in candidates:
            try:
                exists = stat_mod.S_ISREG(os.stat(path).st_mode)
            except (OSError, ValueError):
                exists = False
            if exists:
                problems.append(Problem("shadowed", path, _shadowed(path, p)))
                if not all_problems:
                    return problems
    return problems


def _shadowed(path: str, p: Prepared) -> str:
    """The recorded file a new file at ``path`` takes over (same base name)."""
    base = os.path.basename(path)
    for fpath, _, _ in p.files:
        if os.path.basename(fpath) == base:
            return fpath
    return "an include that found nothing before"


# -- recording ---------------------------------------------------------------------------
def _witness(path: str) -> str | None:
    """The deepest existing directory on ``path``'s way (None: not even the root)."""
    parent = os.path.dirname(path)
    while parent:
        if os.path.isdir(parent):
            return parent
        up = os.path.dirname(parent)
        if up == parent:
            return None
        parent = up
    return None


def _relative(roots: Roots, pos: str, path: str) -> str | None:
    """``path`` as a name under position ``pos`` (None when it is not under it)."""
    if pos == ABSOLUTE:
        return path
    base = roots.path(pos, "")
    if base is None:
        return None
    rel = os.path.relpath(path, base)
    return None if rel.startswith(os.pardir) else rel


def add_variant(
    record: dict[str, Any] | None, name: str, entry_key: bytes, deps: DepSet, roots: Roots
) -> bytes:
    """``record`` with a variant for ``deps`` in front (older ones kept, up to the cap)."""
    dirs: list[list[Any]] = []
    dir_index: dict[tuple[str, str], int] = {}
    witness_of: dict[str, tuple[str, os.stat_result] | None] = {}  # parent -> witness
    rel_of: dict[tuple[str, str], str | None] = {}
    absent = []
    for pos, rel in sorted(deps.absent):
        w = -1
        path = roots.path(pos, rel)
        if path is not None:
            parent = os.path.dirname(path)
            if parent not in witness_of:
                witness = _witness(path)
                try:  # stated before the absence is confirmed again, below
                    witness_of[parent] = None if witness is None else (witness, os.stat(witness))
                except OSError:
                    witness_of[parent] = None
            found = witness_of[parent]
            wrel = None
            if found is not None:
                wrel = rel_of.get((pos, found[0]), "")
                if wrel == "":
                    wrel = rel_of[(pos, found[0])] = _relative(roots, pos, found[0])
            if found is not None and wrel is not None and not os.path.lexists(path):
                w = dir_index.get((pos, found[0]), -1)
                if w < 0:
                    st = found[1]
                    w = dir_index[(pos, found[0])] = len(dirs)
                    dirs.append([pos, wrel, st.st_ino, st.st_mtime_ns, st.st_ctime_ns])
        absent.append([pos, rel, w])
    hexkey = entry_key.hex()
    fresh = {
        "key": hexkey,
        "t": deps.started_ns,
        "files": [[f.pos, f.rel, f.digest, *f.stat] for _, f in sorted(deps.files.items())],
        "absent": absent,
        "dirs": dirs,
    }
    kept = [v for v in (record or {}).get("variants", []) if v["key"] != hexkey]
    return encode_record("manifest", {"name": name, "variants": [fresh, *kept][:MAX_VARIANTS]})
