"""Folders that are not caches, and a listing to compare before and after (the
ownership tests of FileStream and the CLI)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

NOT_A_CACHE = "is not a cuforge cache (no CACHEDIR.TAG)"
HOURS_AGO = time.time() - 2 * 3600


def snapshot(root: Path) -> dict[str, tuple[str, bytes, int]]:
    """Every object below ``root``: (kind, bytes of a regular file, mode), no link followed."""
    found: dict[str, tuple[str, bytes, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            kind = (
                "dir"
                if stat.S_ISDIR(st.st_mode)
                else "file"
                if stat.S_ISREG(st.st_mode)
                else "other"
            )
            data = path.read_bytes() if kind == "file" else b""
            found[str(path.relative_to(root))] = (kind, data, st.st_mode)
    return found


def old_file(path: Path, data: bytes = b"keep me") -> Path:
    """``path`` with ``data``, made two hours old (past the stale-temp age)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (HOURS_AGO, HOURS_AGO))
    return path


def user_folder(root: Path) -> Path:
    """A folder that is not a cache, holding what the old open and clear() deleted."""
    old_file(root / "tmp" / "build.log")  # older than the stale-temp age
    old_file(root / "tmp" / "a.b.tmp")  # "*.*.tmp": deleted at once before
    old_file(root / "tmp" / "4242-0badcafe.0.tmp")  # shaped like a dead writer's temp
    old_file(root / "stats" / "x.cnt", b"\0" * 80)  # folded and deleted at close before
    old_file(root / "stats" / "host-4242-0badcafe.cnt", b"\0" * 80)
    old_file(root / "entries" / "data.txt")
    old_file(root / "entries" / "ab" / ("c" * 62))  # shaped like an entry
    old_file(root / "notes.txt")
    return root
