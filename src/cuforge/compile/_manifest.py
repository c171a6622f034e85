"""Header manifests: which header versions produced which cache entry, checked cheaply.

A manifest is a ``manifest`` record (``cuforge.storage.record``) stored as an
ordinary cache entry under a key that covers everything but the headers (the
source, flags, compiler, include directories by position). It lists up to
``MAX_VARIANTS`` variants, newest first; each names the entry key of one compile
and the files it read::

    {"v": 1, "kind": "manifest", "name": "k.cu", "variants": [
        {"key": "<hex entry key>", "t": <ns when recorded>,
         "files": [[pos, rel, digest, size, mtime_ns, ino, ctime_ns], ...],
         "absent": [[pos, rel], ...]}]}

``pos`` is a search position (``S`` source directory, ``C`` working directory,
``0``, ``1``... include_path entries, ``A`` absolute), ``rel`` the name relative to
it, so two checkouts at different roots share manifests and entries.

A variant holds when every file has its recorded content and every absent
candidate is still absent. Content is checked by digest; the recorded stat
(size, mtime, inode, ctime) is a shortcut taken only when the file was already
older than ``RACY_NS`` when recorded (an edit within the file system's timestamp
granularity could otherwise keep the stat), and a per-process memo does the same
for files digested here. Any difference is a miss, never a stale hit.
"""

from __future__ import annotations

import os
import stat as stat_mod
import threading
import time
from collections import OrderedDict
from typing import Any, NamedTuple

from cuforge.compile._includes import DepSet, Roots, file_digest
from cuforge.storage.record import decode_record, encode_record

__all__ = ["MAX_VARIANTS", "Problem", "add_variant", "check_variant", "decode", "variants"]

MAX_VARIANTS = 8
RACY_NS = 2_000_000_000  # covers every common file system's timestamp granularity
_MEMO_MAX = 4096

_StatKey = tuple[int, int, int, int]


class Problem(NamedTuple):
    """Why a variant does not hold: ``what`` is "edited", "deleted", "shadowed" or
    "moved" (an include directory position that no longer exists)."""

    what: str
    path: str
    detail: str = ""

    def __str__(self) -> str:
        if self.what == "shadowed":
            return f"header {self.path} now exists and shadows {self.detail}"
        if self.what == "moved":
            return f"include directory {self.detail} is not given any more"
        return f"header {self.path} {self.what}"


class _DigestMemo:
    """Per-process (path, stat) -> digest for files older than RACY_NS when read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._memo: OrderedDict[str, tuple[_StatKey, str]] = OrderedDict()

    def get(self, path: str, st: _StatKey) -> str | None:
        with self._lock:
            hit = self._memo.get(path)
            return hit[1] if hit is not None and hit[0] == st else None

    def put(self, path: str, st: _StatKey, digest: str, now_ns: int) -> None:
        if st[1] > now_ns - RACY_NS or st[3] > now_ns - RACY_NS:
            return  # too new to trust its stat later
        with self._lock:
            self._memo[path] = (st, digest)
            self._memo.move_to_end(path)
            if len(self._memo) > _MEMO_MAX:
                self._memo.popitem(last=False)


_memo = _DigestMemo()


def _stat_key(st: os.stat_result) -> _StatKey:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def _current_digest(path: str, st: os.stat_result) -> str | None:
    """The digest of the regular file at ``path`` (None: unreadable or not a file)."""
    key = _stat_key(st)
    known = _memo.get(path, key)
    if known is not None:
        return known
    try:
        with open(path, "rb") as f:
            content = f.read()
            after = os.fstat(f.fileno())
    except OSError:
        return None
    digest = file_digest(content)
    if _stat_key(after) == key:
        _memo.put(path, key, digest, time.time_ns())
    return digest


def check_variant(
    variant: dict[str, Any], roots: Roots, all_problems: bool = False
) -> list[Problem]:
    """The problems that stop ``variant`` from holding here and now (empty: it holds).

    Stops at the first problem unless ``all_problems``.
    """
    problems: list[Problem] = []
    recorded_at = variant.get("t", 0)
    for pos, rel, digest, size, mtime_ns, ino, ctime_ns in variant["files"]:
        path = roots.path(pos, rel)
        if path is None:
            problems.append(Problem("moved", rel, f"#{pos}"))
        else:
            try:
                st = os.stat(path)
            except (OSError, ValueError):
                problems.append(Problem("deleted", path))
            else:
                if not stat_mod.S_ISREG(st.st_mode):
                    problems.append(Problem("deleted", path))
                elif (
                    not (
                        _stat_key(st) == (size, mtime_ns, ino, ctime_ns)
                        and mtime_ns <= recorded_at - RACY_NS
                        and ctime_ns <= recorded_at - RACY_NS
                    )
                    and _current_digest(path, st) != digest
                ):
                    problems.append(Problem("edited", path))
        if problems and not all_problems:
            return problems
    for pos, rel in variant["absent"]:
        path = roots.path(pos, rel)
        if path is None:
            continue  # a position that no longer exists holds no file
        try:
            exists = stat_mod.S_ISREG(os.stat(path).st_mode)
        except (OSError, ValueError):
            exists = False
        if exists:
            problems.append(Problem("shadowed", path, _shadowed_name(rel, variant)))
            if not all_problems:
                return problems
    return problems


def _shadowed_name(rel: str, variant: dict[str, Any]) -> str:
    """The include the new file would take over: the recorded file of that name."""
    base = os.path.basename(rel)
    for _pos, frel, *_ in variant["files"]:
        if os.path.basename(frel) == base:
            return frel
    return f"a search for {rel!r} that found nothing"


def decode(data: bytes | None) -> dict[str, Any] | None:
    """The manifest in ``data``; None when it is not a well-formed one."""
    record = decode_record(data, "manifest")
    if record is None or not isinstance(record.get("variants"), list):
        return None
    for v in record["variants"]:
        if not (
            isinstance(v, dict)
            and isinstance(v.get("key"), str)
            and isinstance(v.get("t"), int)
            and isinstance(v.get("files"), list)
            and isinstance(v.get("absent"), list)
            and all(_is_file_row(r) for r in v["files"])
            and all(
                isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r)
                for r in v["absent"]
            )
        ):
            return None
    return record


def _is_file_row(row: Any) -> bool:
    return (
        isinstance(row, list)
        and len(row) == 7
        and all(isinstance(x, str) for x in row[:3])
        and all(isinstance(x, int) and not isinstance(x, bool) for x in row[3:])
    )


def variants(record: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [] if record is None else record["variants"]


def add_variant(record: dict[str, Any] | None, name: str, entry_key: bytes, deps: DepSet) -> bytes:
    """``record`` with a variant for ``deps`` in front (older ones kept, up to the cap)."""
    hexkey = entry_key.hex()
    fresh = {
        "key": hexkey,
        "t": time.time_ns(),
        "files": [[f.pos, f.rel, f.digest, *f.stat] for _, f in sorted(deps.files.items())],
        "absent": [[pos, rel] for pos, rel in sorted(deps.absent)],
    }
    kept = [v for v in variants(record) if v["key"] != hexkey]
    return encode_record("manifest", {"name": name, "variants": [fresh, *kept][:MAX_VARIANTS]})
