"""Small filesystem helpers for the file-stream backend."""

from __future__ import annotations

import os
import stat as stat_mod
from collections import namedtuple

from ._winretry import unlink_retry

__all__ = [
    "DIR_FD",
    "O_NOFOLLOW",
    "PRIVATE_DIR",
    "PRIVATE_FILE",
    "UTIME_BY_FD",
    "Fingerprint",
    "check_mode",
    "fingerprint",
    "list_dir",
    "make_dir",
    "open_dir",
    "unlink_if_unchanged",
]

#: Modes of what a cache creates when no ``mode=`` asks for group sharing.
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
#: Whether directories can be opened without following links and used as anchors
#: (``dir_fd=``): then writes, scans and deletions never follow a link below the root.
DIR_FD = bool(
    O_NOFOLLOW
    and _O_DIRECTORY
    and {os.open, os.mkdir, os.rename, os.stat, os.unlink} <= os.supports_dir_fd  # + replace
    and os.scandir in os.supports_fd
)

#: Whether file times can be set through a descriptor (the file read or written, not
#: whatever the path names by then).
UTIME_BY_FD = os.utime in os.supports_fd


class Fingerprint(namedtuple("Fingerprint", ["ino", "size", "mtime_ns"])):
    """What identifies one version of a file (ino, size, mtime_ns): a replaced file
    differs in inode."""

    __slots__ = ()
    ino: int
    size: int
    mtime_ns: int


def fingerprint(st: os.stat_result) -> Fingerprint:
    return Fingerprint(st.st_ino, st.st_size, st.st_mtime_ns)


def check_mode(mode: int | None) -> tuple[int | None, int | None]:
    """Validate ``mode=`` and return ``(dir_mode, file_mode)``.

    ``mode`` is the permission of the directories the cache creates, e.g.
    ``0o2770`` (setgid + group rwx) for a group-shared cache. Files get the same
    read/write bits without execute and special bits (``0o2770`` -> ``0o660``).
    """
    if mode is None:
        return None, None
    if isinstance(mode, bool) or not isinstance(mode, int):
        raise TypeError(f"mode must be an int such as 0o2770 or None, got {type(mode).__name__}")
    if mode & ~0o7777 or (mode & 0o700) != 0o700:
        raise ValueError(
            f"mode must be a permission value within 0o7777 that gives the owner rwx "
            f"(e.g. 0o2770 for a group-shared cache), got {oct(mode)}"
        )
    return mode, mode & 0o666


def open_dir(name: str, dir_fd: int | None = None) -> int:
    """A descriptor on directory ``name`` (relative to ``dir_fd`` when given) that
    fails (ELOOP/ENOTDIR) when ``name`` is a symbolic link or not a directory."""
    return os.open(name, os.O_RDONLY | _O_DIRECTORY | O_NOFOLLOW, dir_fd=dir_fd)


def list_dir(name: str, dir_fd: int | None = None) -> list[tuple[str, os.stat_result]]:
    """``(name, lstat)`` of every entry of directory ``name`` (relative to ``dir_fd``);
    entries that vanish meanwhile are skipped; ``[]`` when the directory cannot be
    read or is a link."""
    fd = -1
    found = []
    try:
        if DIR_FD:
            fd = open_dir(name, dir_fd)
        with os.scandir(fd if fd >= 0 else name) as it:
            for e in it:
                try:  # relative to fd: before it is closed
                    found.append((e.name, e.stat(follow_symlinks=False)))
                except OSError:
                    continue
    except OSError:
        return found
    finally:
        if fd >= 0:
            os.close(fd)
    return found


def make_dir(path: str, dir_mode: int | None) -> None:
    """Create ``path`` (and parents); give directories created here ``dir_mode``
    (None: private, 0o700).

    A group mode is applied with chmod after creation, so the umask does not
    narrow it. Existing directories are left alone: they may belong to another user.
    """
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path and not os.path.isdir(parent):
        make_dir(parent, dir_mode)
    try:
        os.mkdir(path, PRIVATE_DIR if dir_mode is None else dir_mode & 0o777)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return
    if dir_mode is not None:
        os.chmod(path, dir_mode)


def unlink_if_unchanged(path: str, expected: Fingerprint, dir_fd: int | None = None) -> bool:
    """Delete ``path`` (relative to ``dir_fd`` when given, never following a link
    there) only if it is still the file ``expected`` describes.

    Protects a file that a concurrent writer put in place after the caller looked
    (it has another inode). There is a window of one stat between the check and
    the unlink; a replace landing exactly there is lost, which costs a recompile.
    """
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    if not stat_mod.S_ISREG(st.st_mode) or fingerprint(st) != expected:
        return False
    try:
        if dir_fd is None:
            unlink_retry(path)
        else:
            os.unlink(path, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def read_at0(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes from the start of ``fd``, without moving a shared offset."""
    if hasattr(os, "pread"):
        return os.pread(fd, n, 0)
    os.lseek(fd, 0, os.SEEK_SET)  # pragma: no cover - Windows
    return os.read(fd, n)  # pragma: no cover


def write_at0(fd: int, data: bytes) -> int:
    """Write ``data`` at the start of ``fd`` (fixed-size records rewritten in place);
    the bytes written (short only when the file system ran out mid-write)."""
    if hasattr(os, "pwrite"):
        return os.pwrite(fd, data, 0)
    os.lseek(fd, 0, os.SEEK_SET)  # pragma: no cover - Windows
    return os.write(fd, data)  # pragma: no cover
