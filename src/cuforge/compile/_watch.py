"""Header change notification (Linux inotify): repeat hits without re-stating headers.

A long-running process that compiles the same kernels again and again would
otherwise stat every header of every manifest on every hit. After a manifest
variant has been validated, the files it depends on are watched; while no
relevant event arrives, the variant still holds and a hit costs one ``poll``.

Why this is safe: the kernel queues an inotify event synchronously, inside the
system call that changes the file, so every change that completes after a watch
is added is seen by the next poll. The order is: add watches, drain the queue
(``epoch``), then validate by stat/digest; a change racing the validation either
shows in the validation or leaves an event that bumps the epoch. Watched are each
file itself (by inode, so a write through another hard link or mount counts),
its directory and every ancestor directory (renames, deletions and re-pointed
symlinks anywhere on the path), and the directories that prove a candidate
absent (any entry created there). Events on names that cannot matter (a new
file beside an ancestor) are ignored; an overflowed queue invalidates everything.

Used only where it can be trusted: Linux, a local file system (ext4, xfs, btrfs,
tmpfs, overlay, zfs, f2fs -- not NFS, SMB, FUSE or 9p, whose remote changes raise
no event), watches available. Anything else, or ``CUFORGE_WATCH=0``, leaves the
stat validation in charge. A forked child drops the parent's watcher (the two
would share and steal one event queue) and starts its own.
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
import sys
import threading

__all__ = ["MAX_WATCHES", "Watcher", "watcher"]

_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_Q_OVERFLOW = 0x400, 0x800, 0x4000
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
#: Paths one process watches at most (the kernel's per-user limit is often 8192 too);
#: past it, variants are validated by stat as where no watcher exists.
MAX_WATCHES = 8192


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
        self._wds: dict[str, int] = {}  # path -> watch descriptor
        self._names: dict[int, set[str] | None] = {}  # wd -> names that matter (None: all)
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

    def _relevant(self, wd: int, mask: int, name: bytes) -> bool:
        if mask & _IN_Q_OVERFLOW or wd not in self._names or not name:
            return True
        names = self._names[wd]
        return names is None or os.fsdecode(name) in names

    def watch(self, files: list[str], witness_dirs: list[str]) -> bool:
        """Watch ``files`` (content and replacement) and ``witness_dirs`` (any new
        entry), with every ancestor directory. False when any of them cannot be
        watched reliably, or this process already watches ``MAX_WATCHES`` paths
        (then the caller keeps validating by stat)."""
        with self._lock:
            if len(self._wds) + len(files) + len(witness_dirs) > MAX_WATCHES:
                return False  # bounded: a process compiling ever new trees stats instead
            try:
                for path in files:
                    self._add(path, set())
                    self._add_ancestors(path)
                for path in witness_dirs:
                    self._add(path, _ALL)
                    self._add_ancestors(path)
            except OSError:
                return False
            return True

    def _add_ancestors(self, path: str) -> None:
        child = path
        parent = os.path.dirname(child)
        while parent and parent != child:
            self._add(parent, {os.path.basename(child)})
            child, parent = parent, os.path.dirname(parent)

    def _add(self, path: str, names: set[str] | None) -> None:
        """Watch ``path``; events naming an entry of it matter only for ``names``
        (None: all). A file's own events carry no name and always matter."""
        wd = self._wds.get(path)
        if wd is None:
            self._check_local(path)
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), _MASK)
            if wd < 0:
                import ctypes

                raise OSError(ctypes.get_errno(), f"cannot watch {path}")
            self._wds[path] = wd
        current = self._names.get(wd, set())
        if names is None or current is None:
            self._names[wd] = None
        else:
            self._names[wd] = current | names

    def _check_local(self, path: str) -> None:
        dev = os.stat(path).st_dev
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
