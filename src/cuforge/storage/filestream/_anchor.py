"""Per-access no-follow access to ``entries/<shard>/`` files, and removal of foreign
objects found there.

The no-symlink rule of a cache must hold for every access, not only at open: a
shard replaced by a symbolic link (or by anything that is not a directory) after a
handle opened must never send a read, a delete or a write outside the root. So the
handle keeps one descriptor of ``entries/``, opened without following links at the
first access, and opens each shard relative to it with ``O_NOFOLLOW|O_DIRECTORY``
(ELOOP or ENOTDIR for anything else); files are then opened and unlinked relative
to the shard's descriptor, also without following links. Nothing here races: every
step is relative to a descriptor that was checked when it was opened.

``entries/`` deleted and recreated under a live handle (a user wiping the cache) is
noticed when a shard is absent and the kept descriptor names a deleted directory:
it is opened again. Platforms without ``dir_fd`` (Windows) use paths (``DIR_FD``).

Foreign objects -- a FIFO, socket, device, link or directory where an entry file
belongs, a non-directory where a shard belongs -- are never opened for reading and
are removed by ``remove_foreign`` (a directory with everything in it, never
following a link), so no key stays unstorable and ``verify --fix`` can clean up.
"""

from __future__ import annotations

import contextlib
import os
import stat as stat_mod
import threading

from .._fsutil import DIR_FD, list_dir, open_dir

__all__ = ["EntriesAnchor", "describe", "remove_foreign"]


class EntriesAnchor:
    """A kept no-follow descriptor of ``entries/``; shards opened per access."""

    def __init__(self, entries_dir: str) -> None:
        self._path = entries_dir
        self._fd = -1
        self._old: list[int] = []  # replaced descriptors: closed at close(), never in use
        self._mutex = threading.Lock()

    def _entries_fd(self, fresh: bool = False) -> int:
        with self._mutex:
            if self._fd >= 0 and not fresh:
                return self._fd
            fd = open_dir(self._path)  # FileNotFoundError: no entries/ (a miss)
            if self._fd >= 0:
                self._old.append(self._fd)
            self._fd = fd
            return fd

    def entries_fd(self) -> int:
        """The kept descriptor of ``entries/`` (not to be closed by the caller)."""
        return self._entries_fd()

    def shard(self, name: str) -> int:
        """A descriptor of shard ``name`` (the caller closes it). FileNotFoundError when
        absent; ELOOP/ENOTDIR (OSError) when something else stands there."""
        efd = self._entries_fd()
        try:
            return open_dir(name, efd)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                if os.fstat(efd).st_nlink == 0:  # entries/ was deleted: look at the new one
                    return open_dir(name, self._entries_fd(fresh=True))
            raise

    def close(self) -> None:
        with self._mutex:
            for fd in [self._fd, *self._old]:
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._fd, self._old = -1, []


def describe(st: os.stat_result) -> str:
    """What a foreign object is, in a word or two."""
    mode = st.st_mode
    for test, word in (
        (stat_mod.S_ISDIR, "a directory"),
        (stat_mod.S_ISLNK, "a symbolic link"),
        (stat_mod.S_ISFIFO, "a FIFO"),
        (stat_mod.S_ISSOCK, "a socket"),
        (stat_mod.S_ISCHR, "a character device"),
        (stat_mod.S_ISBLK, "a block device"),
        (stat_mod.S_ISREG, "a file"),
    ):
        if test(mode):
            return word
    return "an unknown object"


def remove_foreign(
    name: str, dir_fd: int | None, expect_ino: int | None = None, *, files_too: bool = False
) -> bool:
    """Remove the non-regular object ``name`` (relative to ``dir_fd``): unlink it, or
    remove a directory and all it holds (links inside are removed, never followed).
    With ``expect_ino``, only if it is still that inode; ``files_too`` (where a
    directory belongs) removes a regular file as well. Whether it went."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    if (stat_mod.S_ISREG(st.st_mode) and not files_too) or (
        expect_ino is not None and st.st_ino != expect_ino
    ):
        return False  # regular files go through the stat-guarded unlink
    try:
        if stat_mod.S_ISDIR(st.st_mode):
            if dir_fd is None or not DIR_FD:
                import shutil  # on use: with re and fnmatch, ~5 ms of every CLI start

                shutil.rmtree(name)
            else:
                _rmtree_at(name, dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except (OSError, RecursionError):
        return False
    return True


def _rmtree_at(name: str, dir_fd: int) -> None:
    """Remove directory ``name`` (relative to ``dir_fd``) and everything in it, every
    step relative to a no-follow descriptor: a link inside is unlinked, never entered."""
    fd = open_dir(name, dir_fd)
    try:
        for child, st in list_dir(".", fd):
            if stat_mod.S_ISDIR(st.st_mode):
                _rmtree_at(child, fd)
            else:
                os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)
