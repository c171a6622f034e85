"""Header change notification (Linux inotify): repeat hits without re-stating headers.

A long-running process that compiles the same kernels again and again would
otherwise stat every header of every manifest on every hit. After a manifest
variant has been validated, the files it depends on are watched; while no
relevant event arrives, the variant still holds and a hit costs one ``poll``.

What is watched is what the kernel's path lookup passes through *now*: each path
is resolved component by component, following symbolic links as the kernel does
(at most ``_MAX_HOPS`` per walk), and every directory passed is watched for the
one entry looked up in it -- the literal path's ancestors, the directories holding
each symbolic link on the way (where re-pointing happens) and those its target
leads through. The walk ends at the file (watched by inode, so a write through
another hard link or mount counts), or at a directory that proves candidates
absent (any entry created there matters). A path that must stay absent (a link an
absence proof followed, a candidate whose proof does not hold) is walked as far as
its lookup goes now, to the directory where it fails -- an entry missing, a file
where a directory is needed -- watched for that entry. A rename, deletion or
re-pointed link anywhere on the way names the entry in a watched directory; events
on names that cannot matter (a new file beside an ancestor) are ignored.

No watch is trusted to still name what is at its path: the kernel drops a watch
when its inode goes (IN_IGNORED, which retires it here too), and a watch whose
directory was renamed away stays on the old inode. So every validation walks and
re-adds every watch (``inotify_add_watch`` returns the existing descriptor for an
inode already watched), and the descriptors always name the inodes now on the way.

Why this is race-free -- the caller's order, each step closing one race:

1. ``epoch()`` first: it drains the queue. Everything the validation relies on
   is seen after this point, so any later relevant event moves the epoch past the
   value the caller remembers.
2. ``watch()``: each directory is watched *before* its entry is read, and each
   file after its directory. A change that races the walk (a link re-pointed just
   after it was read) lands on a watch already in place: its event moves the epoch
   past step 1's value, so the walk's view, however stale, is never remembered.
   (Draining after the walk would swallow that event and remember a validation
   that the watches do not cover.)
3. validate by stat/digest: the kernel queues an event inside the system call that
   makes the change, so a change before the watches existed shows in the
   validation, and one after it leaves an event.

An overflowed queue invalidates everything. Used only where it can be trusted:
Linux, a local file system (ext4, xfs, btrfs, tmpfs, overlay, zfs, f2fs -- not
NFS, SMB, FUSE or 9p, whose remote changes raise no event), watches available.
Anything else, or ``CUFORGE_WATCH=0``, leaves the stat validation in charge. A
forked child drops the parent's watcher (the two would share and steal one event
queue) and starts its own.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import struct
import sys
import threading
from collections.abc import Sequence

__all__ = ["MAX_WATCHES", "Watcher", "watcher"]

_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_Q_OVERFLOW, _IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
_ENTRY_EVENTS = _IN_MOVED_FROM | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
_SELF_EVENTS = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ATTRIB
# One mask for every watch: the kernel keeps one watch per inode, and a second
# inotify_add_watch with another mask would replace the first one's.
_MASK = _ENTRY_EVENTS | _SELF_EVENTS | _IN_MODIFY | _IN_CLOSE_WRITE
_EVENT = struct.Struct("iIII")

# statfs f_type of local file systems whose changes all pass through this kernel.
_LOCAL_FS = {
    0xEF53,  # ext2/3/4
    0x58465342,  # xfs
    0x9123683E,  # btrfs
    0x01021994,  # tmpfs
    0x858458F6,  # ramfs
    0x794C7630,  # overlayfs
    0x2FC12FC1,  # zfs
    0xF2F52010,  # f2fs
}
_ALL = None  # "every name in this directory matters"
_MAX_HOPS = 40  # symbolic links one walk follows, as Linux's MAXSYMLINKS
#: Watches (inodes) one process holds at most (the kernel's per-user limit is often
#: 8192 too); past it, variants are validated by stat as where no watcher exists.
MAX_WATCHES = 8192


class _Walk:
    """What one ``watch()`` call already did: its walks may share it, because every
    change after the call began moves the epoch the caller read before it."""

    __slots__ = ("added", "dirs")

    def __init__(self) -> None:
        self.added: dict[str, int] = {}  # physical path -> wd added in this call
        # literal dir -> (physical, dev); None: its lookup fails (an absent path's walk)
        self.dirs: dict[str, tuple[str, int | None] | None] = {}


class Watcher:
    """One inotify queue for this process; see the module docstring."""

    def __init__(self) -> None:
        import ctypes  # here, not at import: ctypes.util costs a process ~5 ms to import
        import ctypes.util

        libc_name = ctypes.util.find_library("c") or None
        self._libc = ctypes.CDLL(libc_name, use_errno=True)
        fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        self._lock = threading.Lock()
        self._epoch = 0
        # Live watch descriptor -> names of its entries that matter (None: all). Only
        # bookkeeping for events and the bound: never consulted to skip an add.
        self._wds: dict[int, set[str] | None] = {}
        self._dropped: set[int] = set()  # removed at the bound; their events never matter
        self._fs_ok: dict[int, bool] = {}  # st_dev -> local file system?
        self._statfs_buf = ctypes.create_string_buffer(256)

    def epoch(self) -> int:
        """A number that changes whenever a relevant watched change happened."""
        if self._poll.poll(0):
            with self._lock:
                self._drain()
        return self._epoch

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                self._epoch += 1
                return
            pos = 0
            while pos + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
                name = data[pos + _EVENT.size : pos + _EVENT.size + length].rstrip(b"\0")
                pos += _EVENT.size + length
                if self._relevant(wd, mask, name):
                    self._epoch += 1
                if mask & _IN_IGNORED:  # the kernel dropped the watch: its inode is gone
                    self._wds.pop(wd, None)
                    self._dropped.discard(wd)

    def _relevant(self, wd: int, mask: int, name: bytes) -> bool:
        if mask & _IN_Q_OVERFLOW:
            return True
        if wd in self._dropped:
            return False
        if wd not in self._wds or not name:
            return True
        names = self._wds[wd]
        return names is None or os.fsdecode(name) in names

    def watch(self, files: list[str], witness_dirs: list[str], absent: Sequence[str] = ()) -> bool:
        """Watch ``files`` (content and replacement) and ``witness_dirs`` (any new
        entry; one that does not resolve now is left out, its proof cannot hold), with
        every directory their lookup passes through now, and the lookups of the
        ``absent`` paths as far as they go now. The caller reads ``epoch()`` before
        and validates after (see the module docstring). False when any of them
        cannot be watched reliably, or this process already holds ``MAX_WATCHES``
        watches (then the caller keeps validating by stat)."""
        with self._lock:
            walk = _Walk()
            try:
                if files:  # off a local file system: decline at one stat
                    self._check_local(files[0], os.stat(files[0]).st_dev)
                for path in files:
                    self._add(*self._resolve(path, walk), set(), walk)
                for path in witness_dirs:
                    found = self._follow(path, walk, True)
                    if found is not None:
                        self._add(*found, _ALL, walk)
                for path in absent:
                    self._follow(path, walk, True)
            except (OSError, ValueError):
                return False
            return True

    def _resolve(self, path: str, walk: _Walk) -> tuple[str, int | None]:
        """The physical path (no symbolic link on it) ``path`` names now, and its
        st_dev (None: not known yet), watching the directories on the way."""
        found = self._follow(path, walk, False)
        assert found is not None  # a walk that is not ``absent`` raises where it fails
        return found

    def _follow(self, path: str, walk: _Walk, absent: bool) -> tuple[str, int | None] | None:
        """:meth:`_resolve`; for an ``absent`` path, None where its lookup fails."""
        if not path.startswith("/"):
            path = os.path.join(os.getcwd(), path)
        head, tail = os.path.split(path)
        if head in walk.dirs:
            start = walk.dirs[head]
        else:
            start = walk.dirs[head] = self._walk(("/", None), head, walk, absent)
        if start is None:
            if not absent:
                raise FileNotFoundError(errno.ENOENT, f"{head} does not resolve")
            return None
        return self._walk(start, tail, walk, absent)

    def _walk(
        self, start: tuple[str, int | None], rel: str, walk: _Walk, absent: bool
    ) -> tuple[str, int | None] | None:
        """Look ``rel`` up from the physical directory ``start`` as the kernel does.

        Each directory is watched for the entry about to be read in it *before* it
        is read: re-pointing, renaming or deleting that entry afterwards raises an
        event (this closes the race with a change during the walk). Where the lookup
        fails -- an entry missing, or one that is not a directory with more of the
        path to go -- an ``absent`` walk stops and returns None: the directory is
        already watched for that entry, and only a change to it can let the lookup
        go on. Any other walk raises there."""
        cur, dev = ("/", None) if rel.startswith("/") else start
        todo = rel.split("/")[::-1]
        hops = 0
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            if name == "..":  # cur is physical, so its parent is its dirname
                cur, dev = os.path.dirname(cur), None
                continue
            self._add(cur, dev, {name}, walk)
            entry = os.path.join(cur, name)
            try:
                st = os.lstat(entry)
            except (FileNotFoundError, NotADirectoryError):
                if absent:
                    return None
                raise
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > _MAX_HOPS:
                    raise OSError(errno.ELOOP, f"too many symbolic links in {entry}")
                target = os.readlink(entry)
                if target.startswith("/"):
                    cur, dev = "/", None
                todo.extend(target.split("/")[::-1])
            elif absent and todo and not stat.S_ISDIR(st.st_mode):
                return None  # ENOTDIR: the lookup fails at this entry
            else:
                cur, dev = entry, st.st_dev
        return cur, dev

    def _add(self, path: str, dev: int | None, names: set[str] | None, walk: _Walk) -> None:
        """Watch the inode now at ``path`` (once per call); events naming an entry of
        it matter only for ``names`` (None: all). A file's own events carry no name
        and always matter. Always asks the kernel, which answers with the existing
        descriptor when that inode is already watched: a path that names another
        inode than before gets a watch of its own."""
        wd = walk.added.get(path)
        if wd is None:
            self._check_local(path, os.stat(path).st_dev if dev is None else dev)
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), _MASK)
            if wd < 0:
                import ctypes

                raise OSError(ctypes.get_errno(), f"cannot watch {path}")
            if wd not in self._wds:
                if len(self._wds) >= MAX_WATCHES:  # bounded: ever new trees stat instead
                    self._dropped.add(wd)
                    self._libc.inotify_rm_watch(self._fd, wd)
                    raise OSError(errno.ENOSPC, f"{MAX_WATCHES} watches held")
                self._wds[wd] = set()
            walk.added[path] = wd
        current = self._wds[wd]
        if names is None or current is None:
            self._wds[wd] = None
        else:
            current |= names

    def _check_local(self, path: str, dev: int) -> None:
        ok = self._fs_ok.get(dev)
        if ok is None:
            rc = self._libc.statfs(os.fsencode(path), self._statfs_buf)
            ftype = struct.unpack_from("l", self._statfs_buf.raw)[0] & 0xFFFFFFFF
            ok = self._fs_ok[dev] = rc == 0 and ftype in _LOCAL_FS
        if not ok:
            raise OSError(f"{path} is not on a local file system")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


_instance: Watcher | None = None
_failed = False
_create_lock = threading.Lock()


def watcher() -> Watcher | None:
    """This process's watcher, or None where notification cannot be used."""
    global _instance, _failed
    if _instance is not None or _failed:
        return _instance
    with _create_lock:
        if _instance is None and not _failed:
            if not sys.platform.startswith("linux") or os.environ.get("CUFORGE_WATCH") == "0":
                _failed = True
            else:
                try:
                    _instance = Watcher()
                except (OSError, AttributeError):
                    _failed = True
    return _instance


def _reset_in_child() -> None:
    global _instance, _failed
    if _instance is not None:
        _instance.close()
    _instance, _failed = None, False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
