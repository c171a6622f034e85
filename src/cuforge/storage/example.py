"""An example backend: a directory of framed files, one per entry, without locking.

It shows that a backend is a driver and nothing else -- read, write, remove, scan
-- and it joins every shared contract test (``tests/_backends.py``). The core
(``storage.handle``) gives it the rest: keys, counters, fail-open warnings, drops
of damaged entries, in-process per-key locks; ``storage.frame`` gives it integrity.

Layout: ``<root>/<64 hex>`` is the entry whose id that is (``entry.entry_id``),
its bytes a frame (magic ``CFDX``). Stores write a temp file beside it and rename
it over the entry, so a reader sees an old entry, a new one, or none. There is no
cross-process lock (two processes may compile the same entry; both store the same
bytes) and no size cap. Only names that are entry ids are ever read or deleted
(``ownership.delete_owned``): anything else in the directory stays.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from .driver import Driver
from .entry import CacheEntry, EntryInfo, is_entry_id
from .frame import Frame
from .handle import DriverCache
from .outcome import FAILED, STORED_OUTCOME, Damaged, StoreOutcome
from .ownership import delete_owned

__all__ = ["DirectoryCache", "DirectoryDriver"]

FRAME = Frame(b"CFDX", b"cuforge-dir-1", "file")


class DirectoryDriver(Driver):
    """The files of ``root`` (created if missing)."""

    def __init__(self, root: str) -> None:
        os.makedirs(root, mode=0o700, exist_ok=True)
        self.root = root
        self.label = f"cuforge directory cache {root}"

    def locate(self, kd: bytes) -> tuple[bytes, str]:
        return kd, os.path.join(self.root, kd.hex())

    def read(self, loc: tuple[bytes, str]) -> CacheEntry | Damaged | None:
        kd, path = loc
        try:
            with open(path, "rb") as f:
                value = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.reports.unreadable(exc)
            return None
        found = FRAME.unpack(kd, value)
        return found if type(found) is CacheEntry else Damaged(found, value)

    def write(self, loc: tuple[bytes, str], data: bytes, meta: bytes) -> StoreOutcome:
        kd, path = loc
        tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        try:
            with open(tmp, "xb") as f:
                f.write(FRAME.pack(kd, data, meta, time.time_ns()))
            os.replace(tmp, path)
        except OSError as exc:
            if os.path.exists(tmp):
                os.unlink(tmp)
            return StoreOutcome(FAILED, str(exc))
        return STORED_OUTCOME

    def _owns(self, path: str) -> bool:
        """The ownership proof: an entry id's name directly in the root."""
        return os.path.dirname(path) == self.root and is_entry_id(os.path.basename(path))

    def _unlink(self, paths: list[str]) -> int:
        gone = 0
        for path in paths:
            try:
                os.unlink(path)
                gone += 1
            except FileNotFoundError:
                pass
        return gone

    def remove(self, loc: tuple[bytes, str]) -> bool:
        return delete_owned([loc[1]], self._owns, self._unlink, self.root).removed > 0

    def drop(self, loc: tuple[bytes, str], damaged: Damaged) -> None:
        try:
            with open(loc[1], "rb") as f:
                if f.read() != damaged.token:
                    return  # replaced since it was read: a writer's good entry
        except OSError:
            return
        self.remove(loc)

    def scan(self) -> Iterator[EntryInfo]:
        for name in os.listdir(self.root):
            if not is_entry_id(name):
                continue
            try:
                with open(os.path.join(self.root, name), "rb") as f:
                    st = os.fstat(f.fileno())
                    stored, meta, need = FRAME.meta_of(f.read(4096))
                    if meta is None and need:
                        f.seek(0)
                        stored, meta, _ = FRAME.meta_of(f.read(need))
            except OSError:
                continue
            stored = stored or st.st_mtime_ns
            yield EntryInfo(name, st.st_size, stored, max(st.st_atime_ns, stored), meta)


class DirectoryCache(DriverCache):
    """A :class:`DirectoryDriver` under the storage core: a cache handle."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._root = os.path.abspath(os.fspath(path))
        super().__init__(DirectoryDriver(self._root))

    def __repr__(self) -> str:
        return f"DirectoryCache({self._root!r})"
