"""Listing and maintenance of an S3 cache: ``len``, ``clear``, entries by id.

Each is a listing of ``<prefix>e/`` (never a hit path), so it lives apart from
:class:`cuforge.storage.s3.S3ProgramCache`, which mixes it in; a failed request
becomes one ConnectionError naming the cause (``_maintenance``).

Ownership: the prefix is a folder of a bucket that may hold anything else
(``datasets/`` with ``datasets/e/exp1/results.parquet``). ``clear`` and
``remove_entry`` go through :func:`~cuforge.storage.ownership.delete_owned`: an
object is removed only when its path is exactly an entry path of this prefix,
``<prefix>e/<64 lowercase hex digits>`` -- what the listing lists, ``len`` counts and
``stats`` shows. An object at such a path is the cache's even when it does not
verify (``verify`` names it damaged, ``--fix`` removes it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from ..entry import CacheEntry, EntryInfo, is_entry_id
from ..ownership import delete_owned
from . import _frame as frame

__all__ = ["DELETE_BATCH", "EntryListing"]

_LISTING_HEAD = 4096
#: Objects per bulk DELETE. S3 allows 1,000, but a server under load can take longer
#: than the request timeout to delete that many (SeaweedFS: > 2 s at 1,000 while 8
#: processes hammer it); 100 keep each request short.
DELETE_BATCH = 100


class EntryListing:
    """The listing half of S3ProgramCache (a mixin: the handle supplies the store,
    names and checks declared below)."""

    __slots__ = ()

    _obs: Any
    _mstore: Any  # the handle's maintenance client (a property there)
    _prefix: str
    _where: str

    # Supplied by S3ProgramCache.
    def _maintenance(self, what: str) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _path(self, kd: bytes) -> str:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def _check_writable(self) -> None:
        raise NotImplementedError

    def _objects(self) -> Iterator[dict[str, Any]]:
        for page in self._obs.list(self._mstore, prefix=self._prefix + "e/"):
            yield from page

    def _id_of(self, path: str) -> str | None:
        """The entry id ``path`` is the entry path of, or None: the ownership proof of
        an entry object (exactly ``<prefix>e/<64 lowercase hex digits>``)."""
        eid = path.rpartition("/")[2]
        return eid if path == f"{self._prefix}e/{eid}" and is_entry_id(eid) else None

    def __len__(self) -> int:
        """Entries under this prefix (a listing of the bucket)."""
        self._check_open()
        with self._maintenance("count entries"):
            return sum(1 for o in self._objects() if self._id_of(o["path"]))

    def clear(self) -> None:
        """Remove every entry under this prefix; counters, leases and every object
        that is not at an entry path stay."""
        self._check_writable()
        with self._maintenance("clear"):
            paths = [o["path"] for o in self._objects()]
            delete_owned(paths, lambda p: self._id_of(p) is not None, self._delete, self._where)

    def _delete(self, paths: list[str]) -> int:
        """Delete ``paths`` (proven by the caller) in bulk requests of DELETE_BATCH."""
        for start in range(0, len(paths), DELETE_BATCH):
            self._obs.delete(self._mstore, paths[start : start + DELETE_BATCH])
        return len(paths)

    def iter_entries(self) -> Iterator[EntryInfo]:
        """Entries with size, store time and metadata (one ranged GET each). Object
        stores keep no read times: the last use is the store time."""
        self._check_open()
        with self._maintenance("list entries"):
            for obj in self._objects():
                eid = self._id_of(obj["path"])
                if eid is None:
                    continue
                stored = int(obj["last_modified"].timestamp() * 1e9)
                meta = None
                try:
                    head = bytes(
                        self._obs.get_range(
                            self._mstore,
                            obj["path"],
                            start=0,
                            end=min(_LISTING_HEAD, obj["size"]) or 1,
                        )
                    )
                except FileNotFoundError:
                    continue
                except self._obs.exceptions.BaseError:
                    head = b""
                peeked = frame.peek(head)
                if peeked is not None:
                    stored, end = peeked[0], frame.PREFIX_SIZE + peeked[1]
                    if end > len(head) and end <= obj["size"]:
                        head = bytes(
                            self._obs.get_range(self._mstore, obj["path"], start=0, end=end)
                        )
                    meta = head[frame.PREFIX_SIZE : end] if len(head) >= end else None
                yield EntryInfo(eid, int(obj["size"]), stored, stored, meta)

    def _body_of_id(self, entry_id: str) -> tuple[bytes, bytes | None]:
        if not isinstance(entry_id, str) or not is_entry_id(entry_id):
            return b"", None
        kd = bytes.fromhex(entry_id)
        with self._maintenance("read an entry"):
            try:
                return kd, bytes(self._obs.get(self._mstore, self._path(kd)).bytes())
            except FileNotFoundError as exc:
                if "NoSuchBucket" in str(exc):
                    raise
                return kd, None

    def check_entry(self, entry_id: str) -> str | None:
        self._check_open()
        kd, body = self._body_of_id(entry_id)
        if body is None:
            raise KeyError(entry_id)
        result = frame.unpack(kd, body)
        return None if isinstance(result, CacheEntry) else result

    def read_entry(self, entry_id: str) -> CacheEntry | None:
        self._check_open()
        kd, body = self._body_of_id(entry_id)
        result = None if body is None else frame.unpack(kd, body)
        return result if type(result) is CacheEntry else None

    def remove_entry(self, entry_id: str) -> bool:
        self._check_writable()
        if not isinstance(entry_id, str) or not is_entry_id(entry_id):
            return False
        path = self._path(bytes.fromhex(entry_id))
        with self._maintenance("remove an entry"):
            try:
                self._obs.head(self._mstore, path)
            except FileNotFoundError as exc:
                if "NoSuchBucket" in str(exc):
                    raise
                return False
            proof = self._id_of
            return delete_owned([path], lambda p: proof(p) is not None, self._delete).removed == 1

    @property
    def size_bytes(self) -> int:
        """Sum of the entry objects' sizes (a listing of the bucket)."""
        self._check_open()
        with self._maintenance("list entries"):
            return sum(int(o["size"]) for o in self._objects() if self._id_of(o["path"]))
