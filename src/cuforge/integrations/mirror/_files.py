"""File primitives of the directory mirror: walk, read and write without following a
link, and never write over a file the mirror did not write.

Every path below the mirrored root is reached through directory descriptors opened
with ``O_NOFOLLOW``, one component at a time, so a link planted anywhere under the
root (a file, or a directory on the way) is never followed: a read or write that
meets one fails (``OSError``) and the caller counts the file as skipped. A read is
whole only when the file's ``fstat`` before and after it agree. A write goes to a
temp file in the target's own directory and is *linked* into place (``link`` fails
when the name exists), so a file that appears meanwhile -- the JIT's own -- is never
replaced; where the filesystem has no hard links, a rename after a fresh check
closes all but that instant.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator

from .. import _openflags

__all__ = [
    "Sig",
    "drop_own",
    "foreign_owner",
    "listing",
    "put_back",
    "read_whole",
    "remove_own",
    "safe_relpath",
    "scan",
    "sig_of",
    "take_aside",
    "write_new",
]

#: What identifies one version of a file: (size, mtime_ns, ctime_ns, inode).
Sig = tuple[int, int, int, int]

_DIR = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_READ, _CREATE = _openflags.READ, _openflags.CREATE
#: The mirror's temp names (never published: ``.cuforge-mirror*`` is always skipped).
TEMP_PREFIX = ".cuforge-mirror-"


def sig_of(st: os.stat_result) -> Sig:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def safe_relpath(rel: object) -> str | None:
    """``rel`` when it is a plain relative path below the root (``/``-separated, no
    empty, ``.`` or ``..`` component, no NUL or backslash), else None."""
    if not isinstance(rel, str) or not rel or len(rel) > 4096 or "\0" in rel or "\\" in rel:
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return rel


@contextlib.contextmanager
def _dir(root_fd: int, parts: list[str], create: bool = False) -> Iterator[int]:
    """A descriptor of the directory ``parts`` below ``root_fd``, each component
    opened with ``O_NOFOLLOW`` (made 0o777 & ~umask when ``create``)."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                nxt = os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
                nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def open_root(root: str, create: bool = False) -> int:
    """A descriptor of the mirrored root (its own path may be a link the user chose;
    nothing below it is followed)."""
    if create:
        os.makedirs(root, exist_ok=True)
    return os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))


def foreign_owner(root: str | int) -> int | None:
    """The owner's uid when the directory ``root`` (a path, or a descriptor of it)
    exists and belongs to another user than this process's effective one; None when
    it is ours, absent, or the platform has no owners. A hydrate never writes into
    such a directory: the files would be ours in another user's cache, and the JIT of
    that user would load what we put there."""
    euid = getattr(os, "geteuid", None)
    if euid is None:
        return None
    try:
        st = os.fstat(root) if isinstance(root, int) else os.stat(root)
    except OSError:
        return None
    return None if st.st_uid == euid() else st.st_uid


def scan(
    root_fd: int, skipped: Callable[[str], bool], uid: int | None
) -> tuple[dict[str, Sig], int]:
    """Every regular file below ``root_fd`` whose path no skip glob matches, by
    relative path, and how many objects were passed over for being something else
    (a link, FIFO, socket, device) or, when ``uid`` is given, not owned by ``uid``
    (a directory not owned by it is not entered)."""
    found: dict[str, Sig] = {}
    passed = 0
    stack: list[tuple[int, str]] = [(os.dup(root_fd), "")]
    try:
        while stack:
            fd, prefix = stack.pop()
            try:
                with os.scandir(fd) as it:
                    entries = list(it)
                for entry in entries:
                    rel = prefix + entry.name
                    if skipped(entry.name):
                        continue
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if uid is not None and st.st_uid != uid:
                        passed += 1
                    elif stat.S_ISDIR(st.st_mode):
                        try:
                            stack.append((os.open(entry.name, _DIR, dir_fd=fd), rel + "/"))
                        except OSError:
                            passed += 1
                    elif stat.S_ISREG(st.st_mode):
                        found[rel] = sig_of(st)
                    else:
                        passed += 1
            except OSError:
                passed += 1
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)
    return found, passed


def listing(root_fd: int, rel_dir: str, keep: Callable[[str], bool]) -> dict[str, os.stat_result]:
    """``lstat`` of whatever stands in the directory ``rel_dir`` (reached without
    following a link: OSError when one is on the way; empty when it is absent) under
    a name ``keep`` accepts, by name."""
    found: dict[str, os.stat_result] = {}
    try:
        with _dir(root_fd, [p for p in rel_dir.split("/") if p]) as fd, os.scandir(fd) as it:
            for entry in it:
                if keep(entry.name):
                    found[entry.name] = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return {}
    return found


def lstat_at(root_fd: int, rel: str) -> os.stat_result | None:
    """``lstat`` of ``rel`` reached without following links; None when absent (or a
    directory on the way is missing). Raises OSError when a component on the way is
    not a directory (a link, a file)."""
    *dirs, name = rel.split("/")
    try:
        with _dir(root_fd, dirs) as fd:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def read_whole(root_fd: int, rel: str, limit: int) -> tuple[bytes, Sig] | None:
    """The bytes of the regular file ``rel`` and its signature, when it is read
    whole: never through a link, never a FIFO's wait, and its ``fstat`` the same
    before and after the read (a file still being written is None). None too when it
    is larger than ``limit`` or cannot be read."""
    *dirs, name = rel.split("/")
    try:
        with _dir(root_fd, dirs) as dfd:
            fd = os.open(name, _READ, dir_fd=dfd)
    except OSError:
        return None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode) or before.st_size > limit:
            return None
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        after = os.fstat(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if sig_of(before) != sig_of(after) or len(data) != after.st_size:
        return None
    return data, sig_of(after)


def write_new(root_fd: int, rel: str, data: bytes) -> Sig | None:
    """Write ``data`` at ``rel`` only where nothing stands: a temp file in the same
    directory, linked into place, so a reader sees the whole file or none and a name
    that exists meanwhile is kept (None). Directories on the way are made; a link on
    the way raises OSError. Returns the written file's signature."""
    *dirs, name = rel.split("/")
    with _dir(root_fd, dirs, create=True) as dfd:
        tmp = f"{TEMP_PREFIX}{os.urandom(8).hex()}.tmp"
        fd = os.open(tmp, _CREATE, 0o666, dir_fd=dfd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                ino = os.fstat(fd).st_ino
            finally:
                os.close(fd)
            placed = _link_noreplace(dfd, tmp, name)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
        if not placed:
            return None
        # Stat after the temp name is gone: dropping a link changes the file's ctime.
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        return sig_of(st) if st.st_ino == ino else None


def _link_noreplace(dfd: int, tmp: str, name: str) -> bool:
    """Give the temp file ``tmp`` the name ``name`` unless ``name`` exists."""
    try:
        os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (
            errno.EPERM,
            errno.EOPNOTSUPP,
            errno.ENOTSUP,
            errno.EXDEV,
            errno.EMLINK,
        ):
            raise
    # No hard links here: check, then rename (a name made between the two is replaced).
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
        return False
    except FileNotFoundError:
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        return True


def take_aside(root_fd: int, rel: str, expect: Sig) -> str | None:
    """Move the file at ``rel`` aside (a rename to a temp name in its directory) when
    it is still exactly the version ``expect`` (the mirror's own write); returns the
    temp name, or None when it is another version (then it stays or is put back).

    Closes the race of a JIT writing the file between the mirror's check and its
    replacement: the rename takes whatever stands there, and only a file proven to be
    the mirror's own stays aside; another is linked back (never over a newer one)."""
    *dirs, name = rel.split("/")
    with _dir(root_fd, dirs) as dfd:
        aside = f"{TEMP_PREFIX}{os.urandom(8).hex()}.aside"
        os.rename(name, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
        st = os.stat(aside, dir_fd=dfd, follow_symlinks=False)
        size, mtime, _ctime, ino = expect  # a rename changes ctime, nothing else
        if stat.S_ISREG(st.st_mode) and (st.st_size, st.st_mtime_ns, st.st_ino) == (
            size,
            mtime,
            ino,
        ):
            return aside
        if _link_noreplace(dfd, aside, name):
            with contextlib.suppress(OSError):
                os.unlink(aside, dir_fd=dfd)  # the same file keeps its own name
        # else: a newer file took the name meanwhile; the older one stays aside
        return None


def remove_own(root_fd: int, rel_dir: str, names: list[str]) -> int:
    """Unlink the mirror's own temp ``names`` (made by this process) in ``rel_dir``."""
    removed = 0
    with _dir(root_fd, [p for p in rel_dir.split("/") if p]) as dfd:
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dfd)
                removed += 1
    return removed


def drop_own(root_fd: int, rel_dir: str, names: dict[str, Sig]) -> None:
    """Remove the files ``names`` of ``rel_dir`` (name -> the version the mirror
    wrote or moved aside), each only once proven still that version (size, mtime,
    inode: a rename changes only the ctime), through ``storage.ownership``'s gate."""
    if not names:
        return
    from cuforge.storage.ownership import delete_owned

    def proves(name: str) -> bool:
        try:
            st = lstat_at(root_fd, f"{rel_dir}/{name}" if rel_dir else name)
        except OSError:
            return False
        size, mtime, _ctime, ino = names[name]
        return (
            st is not None
            and stat.S_ISREG(st.st_mode)
            and (st.st_size, st.st_mtime_ns, st.st_ino) == (size, mtime, ino)
        )

    delete_owned(list(names), proves, lambda own: remove_own(root_fd, rel_dir, own), rel_dir)


def put_back(root_fd: int, rel: str, aside: str, expect: Sig) -> None:
    """Give the file :func:`take_aside` moved to ``aside`` its name ``rel`` again,
    never over a file that took the name meanwhile (then the moved copy, proven the
    version ``expect``, is removed)."""
    *dirs, name = rel.split("/")
    with _dir(root_fd, dirs) as dfd:
        if _link_noreplace(dfd, aside, name):
            with contextlib.suppress(OSError):
                os.unlink(aside, dir_fd=dfd)
            return
    drop_own(root_fd, "/".join(dirs), {aside: expect})
