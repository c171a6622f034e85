"""Directory scans of a file-stream cache: only for eviction, clear(), len() and
seeding the size ledger -- never on the read or ordinary write path."""

from __future__ import annotations

import os
import stat as stat_mod
from collections import namedtuple
from collections.abc import Iterator

from ._fsutil import Fingerprint, fingerprint, unlink_if_unchanged
from ._integrity import SIDECAR_SUFFIX

__all__ = ["ORPHAN_SIDECAR_AGE_NS", "Scanned", "remove_scanned", "scan_entries", "sweep_temps"]

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


def sweep_temps(tmp_dir: str, now_ns: int, stale_age_ns: int) -> int:
    """Delete temp files older than ``stale_age_ns``; return the live ones' bytes.

    Temp files of crashed writers are the only thing that leaks; live ones are
    counted because they occupy the disk too.
    """
    live = 0
    for e, st in _regular_files(tmp_dir):
        if st.st_mtime_ns < now_ns - stale_age_ns:
            unlink_if_unchanged(e.path, fingerprint(st))
        else:
            live += st.st_size
    return live


def _regular_files(directory: str) -> Iterator[tuple[os.DirEntry[str], os.stat_result]]:
    """Regular files in ``directory`` with their stats; a directory or file that
    vanishes or cannot be read meanwhile is skipped."""
    try:
        listing = list(os.scandir(directory))
    except OSError:
        return
    for e in listing:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat_mod.S_ISREG(st.st_mode):
            yield e, st


def scan_entries(entries_dir: str) -> tuple[list[Scanned], int]:
    """Every entry (pairs, lone payloads, lone sidecars) and their total bytes."""
    payloads: dict[str, os.stat_result] = {}
    sidecars: dict[str, os.stat_result] = {}
    try:
        shards = [e.path for e in os.scandir(entries_dir) if e.is_dir(follow_symlinks=False)]
    except OSError:
        shards = []
    cut = -len(SIDECAR_SUFFIX)
    for shard in shards:
        for e, st in _regular_files(shard):
            if e.name.endswith(SIDECAR_SUFFIX):
                sidecars[e.path[:cut]] = st
            else:
                payloads[e.path] = st
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


def remove_scanned(entry: Scanned, now_ns: int, force: bool) -> int:
    """Remove one scanned entry, stat-guarded; return the bytes freed.

    A payload a writer replaced since the scan is kept (and its sidecar with it).
    Young orphan sidecars are kept unless ``force`` (``clear()``).
    """
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
