"""Directory scans of a file-stream cache: only for eviction, clear(), len() and
seeding the size ledger -- never on the read or ordinary write path (the sweep of
stale temp files at open is ``_atomicwrite.sweep_temps``).

Directories are opened without following links (where the platform allows): a
shard, ``entries/`` or ``tmp/`` replaced by a symbolic link is not listed, so
nothing outside the cache is ever considered for deletion. Only names of the
layout are scanned (``entries/<2 hex>/<62 hex>[.cfsum]``, see ``_owned``): a user's
file under ``entries/`` is never listed, counted or deleted. Deletions go through
``ownership.delete_owned`` with the root's kept proof and are stat-guarded
(``unlink_if_unchanged``): only the very file a scan saw goes.
"""

from __future__ import annotations

import os
import stat as stat_mod
from collections import namedtuple

from .._fsutil import DIR_FD, Fingerprint, fingerprint, list_dir, open_dir, unlink_if_unchanged
from .._integrity import SIDECAR_SUFFIX
from ..ownership import delete_owned
from ._owned import is_entry_file, is_entry_path, is_shard

__all__ = ["ORPHAN_SIDECAR_AGE_NS", "Scanned", "find_foreign", "remove_scanned", "scan_entries"]

# A sidecar without its payload is normal for the instant between a writer's two
# renames; only older orphans are garbage.
ORPHAN_SIDECAR_AGE_NS = 60 * 10**9


class Scanned(
    namedtuple("Scanned", ["atime_ns", "payload", "payload_fp", "sidecar", "sidecar_fp"])
):
    """One entry as a scan saw it: the pair's paths (str) and fingerprints
    (Fingerprint); None where a file is absent."""

    __slots__ = ()
    atime_ns: int
    payload: str | None
    payload_fp: Fingerprint | None
    sidecar: str | None
    sidecar_fp: Fingerprint | None


def _entry_files(entries_dir: str) -> list[tuple[str, os.stat_result]]:
    """``(path, lstat)`` of every regular file named as an entry file in every shard
    of ``entries_dir`` (other names are not the cache's)."""
    efd = -1
    try:
        if DIR_FD:
            efd = open_dir(entries_dir)
    except OSError:
        return []
    try:
        files = []
        for shard, st in list_dir(entries_dir):
            if not stat_mod.S_ISDIR(st.st_mode) or not is_shard(shard):
                continue
            base = os.path.join(entries_dir, shard)
            for name, fst in list_dir(shard, efd) if efd >= 0 else list_dir(base):
                if stat_mod.S_ISREG(fst.st_mode) and is_entry_file(name):
                    files.append((os.path.join(base, name), fst))
        return files
    finally:
        if efd >= 0:
            os.close(efd)


def find_foreign(entries_dir: str) -> list[tuple[str, str]]:
    """``(path relative to entries_dir, what it is)`` of every object standing where a
    file of the cache belongs that is not one: anything but a directory at a shard's
    name, anything but a regular file at an entry file's name inside a shard (a FIFO,
    socket, device, link or directory). Other names are a user's: not listed. Never
    opens them."""
    from ._anchor import describe

    efd = -1
    try:
        if DIR_FD:
            efd = open_dir(entries_dir)
    except OSError:
        return []
    try:
        found = []
        for shard, st in list_dir(entries_dir):
            if not is_shard(shard):
                continue
            if not stat_mod.S_ISDIR(st.st_mode):
                found.append((shard, describe(st)))
                continue
            inside = (
                list_dir(shard, efd) if efd >= 0 else list_dir(os.path.join(entries_dir, shard))
            )
            for name, fst in inside:
                if not stat_mod.S_ISREG(fst.st_mode) and is_entry_file(name):
                    found.append((f"{shard}/{name}", describe(fst)))
        return found
    finally:
        if efd >= 0:
            os.close(efd)


def scan_entries(entries_dir: str) -> tuple[list[Scanned], int]:
    """Every entry (pairs, lone payloads, lone sidecars) and their total bytes."""
    payloads: dict[str, os.stat_result] = {}
    sidecars: dict[str, os.stat_result] = {}
    cut = -len(SIDECAR_SUFFIX)
    for path, st in _entry_files(entries_dir):
        if path.endswith(SIDECAR_SUFFIX):
            sidecars[path[:cut]] = st
        else:
            payloads[path] = st
    total = 0
    found: list[Scanned] = []
    for path, st in payloads.items():
        sst = sidecars.pop(path, None)
        total += st.st_size
        if sst is None:
            found.append(Scanned(st.st_atime_ns, path, fingerprint(st), None, None))
        else:
            total += sst.st_size
            found.append(
                Scanned(
                    st.st_atime_ns, path, fingerprint(st), path + SIDECAR_SUFFIX, fingerprint(sst)
                )
            )
    for path, sst in sidecars.items():
        total += sst.st_size
        found.append(Scanned(0, None, None, path + SIDECAR_SUFFIX, fingerprint(sst)))
    return found, total


def remove_scanned(entry: Scanned, now_ns: int, force: bool, owned: bool) -> int:
    """Remove one scanned entry, stat-guarded, through the ownership gate (``owned``:
    the root's proof; both paths must be entry files'); return the bytes freed.

    A payload a writer replaced since the scan is kept (and its sidecar with it).
    Young orphan sidecars are kept unless ``force`` (``clear()``).
    """
    freed = [0]

    def proves(e: Scanned) -> bool:
        return owned and all(p is None or is_entry_path(p) for p in (e.payload, e.sidecar))

    def remove(own: list[Scanned]) -> int:
        for e in own:
            freed[0] += _remove_pair(e, now_ns, force)
        return len(own)

    where = os.path.dirname(entry.payload or entry.sidecar or "")
    delete_owned((entry,), proves, remove, where)
    return freed[0]


def _remove_pair(entry: Scanned, now_ns: int, force: bool) -> int:
    freed = 0
    if entry.payload is not None:
        assert entry.payload_fp is not None
        if not unlink_if_unchanged(entry.payload, entry.payload_fp):
            return 0
        freed += entry.payload_fp.size
    elif (
        not force
        and entry.sidecar_fp is not None
        and now_ns - entry.sidecar_fp.mtime_ns < ORPHAN_SIDECAR_AGE_NS
    ):
        return 0
    if (
        entry.sidecar is not None
        and entry.sidecar_fp is not None
        and unlink_if_unchanged(entry.sidecar, entry.sidecar_fp)
    ):
        freed += entry.sidecar_fp.size
    return freed
