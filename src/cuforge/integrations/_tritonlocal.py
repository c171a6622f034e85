"""The local copies Triton reads, written from verified bytes (``integrations.triton``).

Triton needs paths: a hit (and a compile's ``put``) leaves each file under
``TRITON_CACHE_DIR/<key>/`` holding exactly the bytes the cuforge cache verified (or
the compile made). What stands at a file's place decides what happens:

- nothing: a new file, written privately and renamed into place (a reader never sees
  a partial file);
- a regular file holding exactly those bytes: kept (a hit's fast path: one open, one
  ``pread``, no ``fstat``);
- a regular file holding anything else (tampered, truncated): it is Triton's cache
  copy, replaced atomically, counted in ``counters["replaced"]``;
- any other object (a link, FIFO, device, socket, directory): not Triton's; left
  exactly as it is -- never followed, waited on, moved or deleted, a FIFO's bytes
  never taken -- and the bytes go to this process's private directory beside it
  (``.cuforge-aside-*``, ``mkdtemp``), with one ``CacheWriteWarning`` per object.

The check and the rename are two steps (POSIX has no "replace only a regular file"):
an object put there between them is replaced, as Triton's own ``put`` would.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
import tempfile
import warnings

from cuforge._stack import outside_level
from cuforge.storage.base import CacheWriteWarning

from . import _openflags

__all__ = ["counters", "materialize", "put_local"]

#: How a local copy is opened for comparison: never through a link, never waiting on
#: a FIFO or device (see ``_local_state``); how ``put`` creates its temp file: new,
#: never through a link, not inherited.
_READ, _NEW = _openflags.READ, _openflags.CREATE

#: This process's group lookups: ``hits``, ``misses`` (a compile follows),
#: ``stored`` (groups stored), ``replaced`` (local copies that differed from the
#: verified bytes and were rewritten), ``unlocked`` (misses that gave up waiting
#: for the kernel's lock, or could not take it, and compiled without it), ``waited``
#: (hits found after waiting for a peer -- a process or a thread -- that held the
#: kernel's lock: its compile and its stores were waited for). Kept here,
#: where ``replaced`` is counted; ``cuforge.integrations.triton.counters`` is this dict.
counters: dict[str, int] = {
    "hits": 0,
    "misses": 0,
    "stored": 0,
    "replaced": 0,
    "unlocked": 0,
    "waited": 0,
}

_ABSENT, _SAME, _DIFFERS, _FOREIGN = range(4)

#: Per key directory, this process's private directory for files whose own place
#: holds an object Triton's cache did not write (see ``materialize``).
_aside: dict[str, str] = {}
#: The paths of such objects already warned about (one warning each per process).
_foreign_seen: set[str] = set()


def _local_state(path: str, data: bytes) -> int:
    """What stands at ``path``: nothing, a regular file holding exactly ``data``, a
    regular file holding anything else, or an object that is not a regular file (a
    link, FIFO, device, socket, directory). Never blocks (``O_NONBLOCK``: a FIFO or
    device opens at once and is closed unread), never follows a link (``O_NOFOLLOW``);
    only a regular file is read."""
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError:
        return _ABSENT
    except OSError:  # a link (ELOOP), a socket (ENXIO), unreadable: look without opening
        try:
            return _DIFFERS if stat.S_ISREG(os.lstat(path).st_mode) else _FOREIGN
        except FileNotFoundError:
            return _ABSENT
        except OSError:
            return _FOREIGN
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return _FOREIGN
        return _SAME if os.read(fd, len(data) + 1) == data else _DIFFERS
    except OSError:
        return _DIFFERS  # a regular file that cannot be read back: rewritten
    finally:
        os.close(fd)


def materialize(directory: str, filename: str, data: bytes) -> str:
    """A path holding exactly ``data`` for Triton to read: ``directory/filename`` when
    that is free or a regular file (an equal file is kept, any other -- tampered,
    truncated -- is Triton's cache copy and is replaced atomically: a reader never
    sees a partial file).

    Any other object there (a link, FIFO, device, socket, directory) is not a file
    Triton's cache wrote, so it is left exactly as it is -- never followed, waited on,
    moved or deleted -- and ``data`` is written instead to this process's private
    directory beside it (``directory/.cuforge-aside-*``, made by ``mkdtemp``), whose
    path is returned; one :class:`CacheWriteWarning` per object says so.

    The hit path costs what it did (open, read, close; no ``fstat``): the open never
    waits (``O_NONBLOCK``) nor follows a link (``O_NOFOLLOW``), and the read is a
    ``pread``, which a FIFO or socket refuses (ESPIPE) without losing a byte, as a
    directory does (EISDIR); only a device node answering exactly ``data`` (non-empty)
    could pass for the file, and whoever can make one there can as well swap any file
    between this check and Triton's read, a race stock Triton has too. The check and
    the rename are two steps as well (POSIX has no "replace only a regular file"): an
    object put there between them is replaced, as Triton's own ``put`` would.
    """
    path = os.path.join(directory, filename)
    try:
        fd = os.open(path, _READ)
    except OSError:
        pass
    else:
        try:
            if data and os.pread(fd, len(data) + 1, 0) == data:
                return path
        except OSError:  # a FIFO or socket (ESPIPE), a directory (EISDIR): see below
            pass
        finally:
            os.close(fd)
    return _rewrite(directory, filename, path, data)


def put_local(directory: str, filename: str, data: bytes) -> str:
    """``put``'s local copy: where nothing stands at ``directory/filename`` -- a cold
    compile's case -- a new file is written and renamed into place at once (one
    ``lstat`` to know, no read-back: there is nothing to compare); anything else there
    is :func:`materialize`'s to judge, exactly as on a hit. An object put there between
    the ``lstat`` and the rename is replaced, as Triton's own ``put`` would."""
    path = os.path.join(directory, filename)
    try:
        os.lstat(path)
    except FileNotFoundError:
        written = _write_new(directory, filename, path, data)
        if written is not None:
            return written
    except OSError:
        pass
    return materialize(directory, filename, data)


_temps = itertools.count()


def _write_new(directory: str, filename: str, path: str, data: bytes) -> str | None:
    """Write ``data`` to a new private temp file in ``directory`` (named by pid and a
    counter, created exclusively, never through a link) and rename it to ``path``;
    None when no such temp file could be made (``materialize`` then does it)."""
    for _ in range(3):
        tmp = os.path.join(directory, f".{filename[:80]}.{os.getpid()}.{next(_temps)}.tmp")
        try:
            fd = os.open(tmp, _NEW, 0o600)
        except FileExistsError:  # a dead process's with our pid: another name
            continue
        except OSError:
            return None
        return _fill_and_replace(fd, tmp, path, data)
    return None


def _rewrite(directory: str, filename: str, path: str, data: bytes) -> str:
    """``materialize`` once the local copy is not plainly ``data``: see there."""
    state = _local_state(path, data)
    if state == _SAME:
        return path
    if state == _DIFFERS:
        counters["replaced"] += 1
    elif state == _FOREIGN:
        _warn_foreign(path)
        directory = _aside_dir(directory, fresh=False)
        path = os.path.join(directory, filename)
        state = _local_state(path, data)
        if state == _SAME:
            return path
        if state == _FOREIGN:  # only this user can write there; a new one is empty
            directory = _aside_dir(os.path.dirname(directory), fresh=True)
            path = os.path.join(directory, filename)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{filename[:80]}.", suffix=".tmp")
    return _fill_and_replace(fd, tmp, path, data)


def _fill_and_replace(fd: int, tmp: str, path: str, data: bytes) -> str:
    """Write ``data`` to the new temp file ``tmp`` (open as ``fd``) and rename it over
    ``path``: a reader sees the old file or the whole new one, never a part. On any
    failure the temp file is removed and the error raised."""
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _aside_dir(directory: str, fresh: bool) -> str:
    """This process's private directory (0700, ``mkdtemp``) in the key ``directory``:
    made at first need, again when ``fresh`` or when it is no longer a directory."""
    aside = _aside.get(directory)
    if aside is not None and not fresh:
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.lstat(aside).st_mode):
                return aside
    if len(_aside) >= 4096:
        _aside.clear()
    aside = _aside[directory] = tempfile.mkdtemp(prefix=".cuforge-aside-", dir=directory)
    return aside


def _warn_foreign(path: str) -> None:
    if path in _foreign_seen:
        return
    if len(_foreign_seen) >= 4096:
        _foreign_seen.clear()
    _foreign_seen.add(path)
    try:
        what = _KINDS.get(stat.S_IFMT(os.lstat(path).st_mode), "an object that is not a file")
    except OSError:
        what = "an object that cannot be examined"
    warnings.warn(
        f"cuforge triton cache: {path} is {what}, not a file Triton's cache wrote; it is "
        "left as it is, and Triton reads the verified bytes from a private directory "
        "beside it",
        CacheWriteWarning,
        stacklevel=outside_level(),
    )


_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFDIR: "a directory",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}
