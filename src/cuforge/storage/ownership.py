"""Ownership: the one gate every destructive operation of a cache goes through.

Guarantee: a cache deletes, moves or replaces only what it can prove is its own.
Every delete, clear, prune, eviction and sweep of every backend hands its
candidates to :func:`delete_owned` with the backend's proof; a candidate that
fails the proof is left where it is, counted in the result, and logged at DEBUG.

The proofs:

- **A cache directory** (FileStream root) is tagged when cuforge creates it: a
  ``CACHEDIR.TAG`` file (the cache-directory convention backup tools honour,
  https://bford.info/cachedir/) whose first line is the convention's signature and
  which carries :data:`TAG_MARK`. An untagged directory is not a cache: opening it
  writable refuses unless it is empty (then it is tagged), and read-only commands
  report "not a cuforge cache" and create nothing. Caches made before tags
  existed are recognised by their size ledger's magic and tagged on their next
  writable open (:func:`legacy_root`).
- **A name inside a tagged directory** must parse as a name of the layout (an
  entry, sidecar, temp or lock name); anything else is a user's and stays.
- **A remote object** (S3 key, Redis key) must parse as an entry name of this
  cache under its prefix.
- **A SQLite file** must carry :data:`SQLITE_APPLICATION_ID` in its header (set at
  creation; a database of an older cuforge is recognised by its tables before it
  is marked).

Failure modes: reading a tag or a header that cannot be read is "not proven"
(nothing is deleted); :func:`tag_root` raises ``OSError`` when it cannot write.
"""

from __future__ import annotations

import contextlib
import os
import threading

from cuforge._log import debug_enabled, get_logger

from ._fsutil import O_NOFOLLOW, PRIVATE_FILE

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import TypeVar

    N = TypeVar("N")

__all__ = [
    "SQLITE_APPLICATION_ID",
    "TAG_MARK",
    "TAG_NAME",
    "TAG_SIGNATURE",
    "Deleted",
    "delete_owned",
    "is_tagged",
    "legacy_root",
    "sqlite_application_id",
    "tag_root",
]

TAG_NAME = "CACHEDIR.TAG"
#: The cache-directory convention's signature: the first bytes of every tag.
TAG_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"
#: What makes a tagged directory cuforge's (any other tag is another program's cache).
TAG_MARK = b"# cuforge program cache"
_TAG_TEXT = (
    TAG_SIGNATURE
    + b"\n"
    + TAG_MARK
    + b" (format 1). Everything below this directory is cuforge's and may be\n"
    + b"# deleted by it; backup tools that honour CACHEDIR.TAG skip it.\n"
)
_TAG_READ_MAX = 4096
#: Written at SQLite header offset 68 (``PRAGMA application_id``): ASCII "CUFG", the mark
#: cuforge's SQLite caches have carried from their first release (so every version agrees).
SQLITE_APPLICATION_ID = 0x43554647
_SQLITE_MAGIC = b"SQLite format 3\x00"
#: The size ledger's magic prefix (``filestream._sizeindex``): every root an earlier
#: cuforge opened writable holds one.
_LEDGER_NAME = "size.ledger"
_LEDGER_MAGIC = b"CFLEDG0"


def _read_head(path: str, n: int, dir_fd: int | None = None) -> bytes | None:
    """Up to ``n`` bytes from the start of the regular file ``path`` (no link
    followed, never blocking on a FIFO); None when it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        import stat as stat_mod

        if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, n)
    except OSError:
        return None
    finally:
        os.close(fd)


def is_tagged(root: str, dir_fd: int | None = None) -> bool:
    """Whether ``root`` holds cuforge's ``CACHEDIR.TAG`` (``dir_fd``: a descriptor
    on ``root``, then ``root`` is only used in messages)."""
    if dir_fd is not None:
        head = _read_head(TAG_NAME, _TAG_READ_MAX, dir_fd)
    else:
        head = _read_head(os.path.join(root, TAG_NAME), _TAG_READ_MAX)
    return head is not None and head.startswith(TAG_SIGNATURE) and TAG_MARK in head


def legacy_root(root: str) -> bool:
    """Whether ``root`` is an untagged cache an earlier cuforge made: its size
    ledger (a regular file, not a link) starts with the ledger's magic."""
    head = _read_head(os.path.join(root, _LEDGER_NAME), len(_LEDGER_MAGIC))
    return head == _LEDGER_MAGIC


def tag_root(root: str, file_mode: int | None = None) -> None:
    """Write cuforge's ``CACHEDIR.TAG`` into ``root``: a temp file linked into place,
    so a reader sees no tag or the whole tag, and an existing tag (ours or another
    program's) is never replaced. Raises ``OSError`` when it cannot write."""
    final = os.path.join(root, TAG_NAME)
    # Unique per call (pid, thread, random): threads of one process tag a new root at
    # once, and a crashed tagger's leftover must not block a later process of its pid.
    tmp = os.path.join(
        root, f".{TAG_NAME}.{os.getpid()}-{threading.get_ident()}-{os.urandom(4).hex()}.tmp"
    )
    mode = PRIVATE_FILE if file_mode is None else file_mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, mode)
    try:
        try:
            os.write(fd, _TAG_TEXT)
        finally:
            os.close(fd)
        if file_mode is not None:
            os.chmod(tmp, file_mode)
        # A concurrent opener tagged it first, or the tag is another program's: kept.
        with contextlib.suppress(FileExistsError):
            os.link(tmp, final)
    finally:
        os.unlink(tmp)


def sqlite_application_id(path: str) -> int | None:
    """The application id in the header of the SQLite database ``path``; None when
    the file is not a SQLite database (or cannot be read)."""
    head = _read_head(path, 72)
    if head is None or len(head) < 72 or not head.startswith(_SQLITE_MAGIC):
        return None
    return int.from_bytes(head[68:72], "big")


class Deleted:
    """What :func:`delete_owned` did: ``removed`` (what ``remove`` reported) and
    ``refused`` (candidates that failed the proof, left in place)."""

    __slots__ = ("refused", "removed")

    def __init__(self, removed: int, refused: int) -> None:
        self.removed = removed
        self.refused = refused

    def __repr__(self) -> str:
        return f"Deleted(removed={self.removed}, refused={self.refused})"


def delete_owned(
    candidates: Iterable[N],
    proves: Callable[[N], bool],
    remove: Callable[[list[N]], int],
    where: str = "",
) -> Deleted:
    """Remove the candidates ``proves`` accepts, all at once through ``remove``
    (which returns how many it removed); leave the others and count them.

    The single gate of every destructive operation: call it with the backend's
    proof, never delete around it.
    """
    own: list[N] = []
    refused = 0
    for name in candidates:
        if proves(name):
            own.append(name)
        else:
            refused += 1
            if debug_enabled("cuforge.cache"):
                get_logger("cuforge.cache").debug(
                    "not deleted (not provably this cache's): %r in %s", name, where
                )
    removed = remove(own) if own else 0
    return Deleted(removed, refused)
