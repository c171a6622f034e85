"""Whether a compile could store in an existing cache level -- found by trying, or
by asking the file system, never from permission bits alone (``cuforge doctor``).

A full disk, an immutable (``chattr +i``) or append-only directory, and root's rights
all pass the permission bits while every store fails. Guarantees: nothing is left
behind and nothing not the cache's own is touched -- a directory cache's probe is one
file of a unique name in its own ``tmp/``, removed at once (its times put back); the
rest only reads (``statvfs``, the inode flags through ``FS_IOC_GETFLAGS``, opening the
database file for writing without writing). Failure modes: a file system that keeps
no inode flags or refuses the ioctl reads as "not immutable" (the tmp/ probe still
ran); a non-Linux system is judged by the probe and the free space alone.
"""

from __future__ import annotations

import contextlib
import os
import sys

from cuforge.storage.diskspace import no_space

__all__ = ["writable"]

#: ``FS_IOC_GETFLAGS`` (``_IOR('f', 1, long)``) and the flags that stop a store.
_GETFLAGS = 0x80086601
_IMMUTABLE, _APPEND = 0x10, 0x20


def writable(scheme: str, location: str) -> tuple[bool, str | None]:
    """Whether a compile could store in the existing ``file``/``sqlite`` level at
    ``location``, and why not. A directory: a file of a unique name made in its own
    ``tmp/``, one byte written, removed (:func:`_try_tmp`); then whether the
    directories a store renames into (the cache's root, ``entries/`` and its shards,
    ``stats/``) are immutable or append-only. A database: the permission bits of the
    file and its folder, its file system's free space, and whether the file opens for
    writing (an immutable file does not)."""
    location = os.path.realpath(location)
    if scheme == "sqlite":
        return _database(location)
    why = _try_tmp(os.path.join(location, "tmp"))
    if why is not None:
        return False, f"a file cannot be written in its tmp/: {why}"
    stuck = _stuck_dir(location)
    if stuck is not None:
        return False, f"{stuck} cannot take new files (immutable or append-only)"
    return True, None


def _database(path: str) -> tuple[bool, str | None]:
    folder = os.path.dirname(path)
    if not (os.access(path, os.W_OK) and os.access(folder, os.W_OK | os.X_OK)):
        return False, None
    full = no_space(folder)
    if full is not None:
        return False, full
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        return False, f"the file cannot be opened for writing: {exc.strerror or exc}"
    os.close(fd)
    if _flags(path) & (_IMMUTABLE | _APPEND):
        return False, "the file is immutable or append-only"
    return True, None


def _stuck_dir(root: str) -> str | None:
    """The first directory a store writes into that is immutable or append-only
    (named relative to the cache: ``entries/a3``), else None."""
    entries = os.path.join(root, "entries")
    places = [root, entries, os.path.join(root, "stats")]
    with contextlib.suppress(OSError):
        places += sorted(e.path for e in os.scandir(entries) if e.is_dir(follow_symlinks=False))
    for place in places:
        if _flags(place) & (_IMMUTABLE | _APPEND):
            rel = os.path.relpath(place, root)
            return "the cache directory" if rel == os.curdir else f"{rel}/"
    return None


def _flags(path: str) -> int:
    """The inode flags of ``path`` (0 where they cannot be read)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        import fcntl

        fd = os.open(
            path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        )
    except (OSError, ImportError):
        return 0
    try:
        got = fcntl.ioctl(fd, _GETFLAGS, bytes(8))
    except OSError:
        return 0
    finally:
        os.close(fd)
    return int.from_bytes(got[:4], sys.byteorder)


def _try_tmp(tmp: str) -> str | None:
    """Create ``<pid>-<8 hex>-0.tmp`` in ``tmp`` (exclusively: never an existing file;
    through ``tmp``'s own descriptor, opened without following a link, so nothing
    outside it is touched), write one byte, remove it, and put the directory's access
    and modification times back; the error that stopped it (None: it worked). The
    name is one a store's writer makes, so a probe a kill interrupted is swept as a
    stale temp (``_owned.temp_kind``: aged). A ``tmp/`` that is not there -- a store
    recreates it -- is made for the probe and removed after it if still empty (the
    cache directory's times put back then)."""

    nofollow = getattr(os, "O_NOFOLLOW", 0)
    as_dir = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow
    parent = os.path.dirname(tmp)
    made = None
    try:
        try:
            dfd = os.open(tmp, as_dir)
        except FileNotFoundError:
            made = os.stat(parent)
            os.mkdir(tmp, 0o700)
            dfd = os.open(tmp, as_dir)
        try:
            _try_in(dfd, tmp)
        finally:
            os.close(dfd)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    finally:
        if made is not None:
            with contextlib.suppress(OSError):  # a store's temp came meanwhile: kept
                os.rmdir(tmp)
                os.utime(parent, ns=(made.st_atime_ns, made.st_mtime_ns))
    return None


def _try_in(dfd: int, tmp: str) -> None:
    """:func:`_try_tmp`'s file in the directory ``dfd`` (``tmp``); raises OSError."""

    was = os.fstat(dfd)
    by_fd = os.open in os.supports_dir_fd
    where = {"dir_fd": dfd} if by_fd else {}
    name = f"{os.getpid()}-{os.urandom(4).hex()}-0.tmp"
    path = name if by_fd else os.path.join(tmp, name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600, **where)
    try:
        os.write(fd, b"\0")
    finally:
        try:
            os.close(fd)
        finally:
            os.unlink(path, **where)
            with contextlib.suppress(OSError):  # the directory as it was, to the eye
                times = (was.st_atime_ns, was.st_mtime_ns)
                os.utime(dfd if os.utime in os.supports_fd else tmp, ns=times)
