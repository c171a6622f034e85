"""Header manifests: which header versions produced which cache entry, checked cheaply.

A manifest is a ``manifest`` record (``cuforge.storage.record``) stored as an
ordinary cache entry under a key that covers everything but the headers (the
source, flags, compiler, include directories by position). It lists up to
``MAX_VARIANTS`` variants, newest first; each names the entry key of one compile
and what that compile read::

    {"key": "<hex entry key>", "t": <ns, before the files were looked at>,
     "files":  [[pos, rel, digest, size, mtime_ns, ino, ctime_ns], ...],
     "absent": [[pos, rel, witness, [link, ...]], ...],
     "dirs":   [[pos, rel, ino, mtime_ns, ctime_ns], ...],
     "links":  [[pos, rel, target], ...]}

``pos`` is a search position (``S`` source directory, ``C`` working directory,
``0``, ``1``... include_path entries, ``A`` absolute) and ``rel`` a name relative
to it, joined to the position's directory as written (never normalised: ``..``
is the kernel's), so two checkouts at different roots share manifests and entries.

A variant holds when every file has its recorded content and every absent
candidate is still absent. Content is compared by digest. Shortcuts, each taken
only for what was already older than ``RACY_NS`` when recorded (an edit within a
file system's timestamp granularity could otherwise leave the stat unchanged):
a file whose stat (size, mtime, inode, ctime) is unchanged has its recorded
content; an absent candidate whose *absence proof* holds is still absent.

The proof is the candidate's lookup as the kernel walks it, component by
component: the *witness* is the directory where it fails (the entry looked up
missing, or a non-directory where a directory is needed, or at the end something
other than a file), named by the literal path the lookup reached it by, and the
*links* are the symbolic links the walk had to follow to get there (each one
dangling, leading to a non-directory, or the candidate's last component), with
their targets. A link that leads to a directory needs no row: the witness's path
runs through it, so its stat would reach another inode were it re-pointed. The
proof holds while every link still reads its target and the witness's (inode,
mtime, ctime) is unchanged: the lookup then passes the same way to the same
directory, whose entries did not change (creating, renaming or deleting an entry
changes a directory's mtime and ctime). The witness is stated after the walk and
before the links and the absence are confirmed again. Rows of three (from a
cuforge that did not follow links) keep no witness: those candidates are stated.
A per-process memo keeps digests of files read here, and :mod:`._watch` lets a
validated variant stand without any stat until an event: it watches each trusted
proof's witness and links, and the lookups of the other candidates as they go now.
"""

from __future__ import annotations

import os
import stat as stat_mod
import threading
import time
from collections import OrderedDict, namedtuple

from cuforge.compile.cache._includes import ABSOLUTE, DepSet, Roots, file_digest
from cuforge.storage.record import decode_record, encode_record

__all__ = [
    "MAX_VARIANTS",
    "Group",
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
_MAX_HOPS = 40  # symbolic links one lookup follows, as Linux's MAXSYMLINKS


class Problem(namedtuple("Problem", ["what", "path", "detail"], defaults=("",))):
    """Why a variant does not hold: "edited", "deleted", "shadowed", or "moved" (an
    include directory position that does not exist any more)."""

    __slots__ = ()

    what: str
    path: str
    detail: str

    def __str__(self) -> str:
        if self.what == "shadowed":
            return f"header {self.path} now exists and shadows {self.detail}"
        if self.what == "moved":
            return f"include directory {self.detail} is not given any more"
        return f"header {self.path} {self.what}"


class Group(namedtuple("Group", ["witness", "trusted_dir", "links", "candidates"])):
    """Absent candidates sharing one proof: the witness directory's path and trusted
    (inode, mtime, ctime), None when there is none to trust (then each candidate is
    stated), and the (path, target) of each link the lookup follows."""

    __slots__ = ()

    witness: str | None
    trusted_dir: tuple[int, int, int] | None
    links: tuple[tuple[str, str], ...]
    candidates: tuple[str, ...]


class Prepared(
    namedtuple(
        "Prepared",
        ["key", "files", "groups", "problems", "watch_files", "watch_dirs", "watch_absent"],
    )
):
    """A variant resolved against this process's search roots, ready to check."""

    __slots__ = ()

    key: bytes
    files: tuple[tuple[str, _StatKey | None, str], ...]  # path, trusted stat, digest
    groups: tuple[Group, ...]
    problems: tuple[Problem, ...]  # found while preparing (a position that is gone)
    watch_files: tuple[str, ...]
    watch_dirs: tuple[str, ...]  # the witnesses of the proofs to trust
    watch_absent: tuple[str, ...]  # their links, and the candidates of no such proof


# -- per-process memos ---------------------------------------------------------------------
TYPE_CHECKING = False  # typing is not imported at run time: a tracked compile paid ~4 ms
if TYPE_CHECKING:
    from typing import Any, Generic, TypeVar

    _K = TypeVar("_K")
    _V = TypeVar("_V")
else:

    class Generic:
        """``_Memo[K, V]`` for the type checker only: at run time a plain class."""

        def __class_getitem__(cls, item: object) -> type:
            return cls

    _K = _V = None


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
        links = v.get("links", [])
        return (
            isinstance(v["key"], str)
            and isinstance(v["t"], int)
            and all(len(r) == 7 and _ints(r, 3) and all(isinstance(x, str) for x in r[:3])
                    for r in v["files"])
            and all(len(r) in (3, 4) and isinstance(r[0], str) and isinstance(r[1], str)
                    and _ints(r[:3], 2) and -1 <= r[2] < len(v["dirs"])
                    and (len(r) == 3 or (isinstance(r[3], list) and _ints(r[3], 0)
                                         and all(0 <= i < len(links) for i in r[3])))
                    for r in v["absent"])
            and all(len(r) == 5 and isinstance(r[0], str) and isinstance(r[1], str)
                    and _ints(r, 2) for r in v["dirs"])
            and isinstance(links, list)
            and all(len(r) == 3 and all(isinstance(x, str) for x in r) for r in links)
        )  # fmt: skip
    except (KeyError, TypeError, AttributeError):
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
    links = [(roots.path(pos, rel), target) for pos, rel, target in v.get("links", [])]
    grouped: dict[tuple[int, tuple[int, ...]], list[str]] = {}
    for row in v["absent"]:
        path = roots.path(row[0], row[1])
        if path is not None:  # a position that no longer exists holds no file
            proof = (row[2], tuple(row[3])) if len(row) == 4 else (-1, ())
            grouped.setdefault(proof, []).append(path)
    groups = []
    for (w, chain), candidates in sorted(grouped.items()):
        witness, trusted_dir = dirs[w] if w >= 0 else (None, None)
        if witness is None:
            trusted_dir = None
        followed = []
        for i in chain:
            link, target = links[i]
            if link is None:  # its position is gone: the proof cannot be checked
                witness = trusted_dir = None
                break
            followed.append((link, target))
        groups.append(Group(witness, trusted_dir, tuple(followed), tuple(candidates)))
    proven = [g for g in groups if g.trusted_dir is not None]
    return Prepared(
        bytes.fromhex(v["key"]),
        tuple(files),
        tuple(groups),
        tuple(problems),
        tuple(f[0] for f in files),
        tuple(dict.fromkeys(g.witness for g in proven if g.witness is not None)),
        (
            *dict.fromkeys(link for g in proven for link, _ in g.links),
            *(c for g in groups if g.trusted_dir is None for c in g.candidates),
        ),
    )


# -- checking ----------------------------------------------------------------------------
def check(
    p: Prepared, all_problems: bool = False, unproven: list[str] | None = None
) -> list[Problem]:
    """What stops the prepared variant from holding here and now (empty: it holds).

    Stops at the first problem unless ``all_problems``. The candidates of a trusted
    proof that no longer holds (they were stated instead) go to ``unproven``: the
    watches of its witness and links do not cover their lookups now.
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
    for witness, trusted_dir, links, candidates in p.groups:
        if witness is not None and trusted_dir is not None:
            try:
                st = os.stat(witness)
                if (st.st_ino, st.st_mtime_ns, st.st_ctime_ns) == trusted_dir and (
                    not links or all(os.readlink(link) == to for link, to in links)
                ):
                    continue
            except (OSError, ValueError):
                pass
            if unproven is not None:
                unproven.extend(candidates)
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
class _Proof(namedtuple("_Proof", ["pos", "rel", "links"])):
    """Where a candidate's lookup fails: the witness directory (a name under position
    ``pos``) and the links followed on the way, as (pos, rel, target)."""

    __slots__ = ()

    pos: str
    rel: str
    links: tuple[tuple[str, str, str], ...]


def _join(rel: str, name: str) -> str:
    """``rel`` and ``name`` as the kernel would read them, nothing normalised."""
    return rel + name if not rel or rel.endswith("/") else rel + "/" + name


def _is_file(path: str) -> bool:
    try:
        return stat_mod.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _is_dir(path: str) -> bool:
    try:
        return stat_mod.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _proof(roots: Roots, pos: str, rel: str) -> _Proof | None:
    """Walk the lookup of ``rel`` under ``pos`` as the kernel does: a name at a time,
    following symbolic links (relative targets from the link's directory). None
    when it cannot be proven absent by a directory (it is a file now, a link loop,
    a position that is gone, an error other than a missing entry)."""
    wpos, wrel = (ABSOLUTE, "/") if pos == ABSOLUTE else (pos, "")
    todo = rel.split("/")[::-1]
    links: list[tuple[str, str, str]] = []
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        erel = _join(wrel, name)
        path = roots.path(wpos, erel)
        if path is None:
            return None
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return _Proof(wpos, wrel, tuple(links))  # the lookup fails in wrel
        except (OSError, ValueError):
            return None
        last = all(n in ("", ".") for n in todo)
        if stat_mod.S_ISLNK(st.st_mode):
            if not last and _is_dir(path):  # the witness's own path runs through it
                wrel = erel
                continue
            if len(links) >= _MAX_HOPS:
                return None
            try:
                target = os.readlink(path)
            except (OSError, ValueError):
                return None
            links.append((wpos, erel, target))
            if target.startswith("/"):
                wpos, wrel = ABSOLUTE, "/"
            todo.extend(target.split("/")[::-1])
        elif stat_mod.S_ISDIR(st.st_mode) and not last:
            wrel = erel
        elif last and stat_mod.S_ISREG(st.st_mode):
            return None  # it exists: nothing to prove
        else:  # a non-directory on the way, or no file at the end: fixed while wrel is
            return _Proof(wpos, wrel, tuple(links))
    return None


def _reads(roots: Roots, link: tuple[str, str, str]) -> bool:
    """Whether ``link`` still reads its recorded target."""
    path = roots.path(link[0], link[1])
    try:
        return path is not None and os.readlink(path) == link[2]
    except (OSError, ValueError):
        return False


def add_variant(
    record: dict[str, Any] | None, name: str, entry_key: bytes, deps: DepSet, roots: Roots
) -> bytes:
    """``record`` with a variant for ``deps`` in front (older ones kept, up to the cap).

    Each absent candidate's proof is walked now; the witness is stated after the walk
    and before the links and the absence are confirmed again, so a change racing the
    recording either shows in the stat (a recent mtime is not trusted) or leaves
    the candidate without a witness."""
    dirs: list[list[Any]] = []
    dir_index: dict[tuple[str, str], int] = {}
    stated: dict[tuple[str, str], os.stat_result | None] = {}  # witness -> its stat
    links: list[list[str]] = []
    link_index: dict[tuple[str, str, str], int] = {}
    absent: list[list[Any]] = []
    for pos, rel in sorted(deps.absent):
        w, chain = -1, []
        path = roots.path(pos, rel)
        proof = None if path is None else _proof(roots, pos, rel)
        if path is not None and proof is not None:
            where = (proof.pos, proof.rel)
            if where not in stated:
                witness = roots.path(*where)
                try:
                    st = None if witness is None else os.stat(witness)
                except (OSError, ValueError):
                    st = None
                stated[where] = st if st is not None and stat_mod.S_ISDIR(st.st_mode) else None
            st = stated[where]
            if (
                st is not None
                and all(_reads(roots, link) for link in proof.links)
                and not _is_file(path)
            ):
                w = dir_index.get(where, -1)
                if w < 0:
                    w = dir_index[where] = len(dirs)
                    dirs.append([*where, st.st_ino, st.st_mtime_ns, st.st_ctime_ns])
                for link in proof.links:
                    if link not in link_index:
                        link_index[link] = len(links)
                        links.append(list(link))
                    chain.append(link_index[link])
        absent.append([pos, rel, w, chain])
    hexkey = entry_key.hex()
    fresh = {
        "key": hexkey,
        "t": deps.started_ns,
        "files": [[f.pos, f.rel, f.digest, *f.stat] for _, f in sorted(deps.files.items())],
        "absent": absent,
        "dirs": dirs,
        "links": links,
    }
    kept = [v for v in (record or {}).get("variants", []) if v["key"] != hexkey]
    return encode_record("manifest", {"name": name, "variants": [fresh, *kept][:MAX_VARIANTS]})
