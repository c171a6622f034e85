"""Atomic publication of a (payload, sidecar) pair through a staging directory,
and the sweep of temp files crashed writers left there.

Liveness of a writer: before its first temp file, a writer (one per handle and
process) creates ``tmp/<tag>.alive`` and holds an exclusive lock on it while it
lives (created under another name, locked, then renamed, so nobody ever sees it
unlocked); its temps are ``tmp/<tag>.<n>.tmp``. The OS drops the lock when the
writer dies, however it dies, so ``sweep_temps`` knows a dead writer's temps at
once -- no pid (reused, or another container's) and no age guess -- and removes
them with its ``.alive`` file. Temps of a live writer are never touched. Other
files writers make (older layouts, stats baselines) still go after ``stale_age_ns``;
a name no writer makes is not the cache's and stays, uncounted (``_owned``). Every
removal goes through ``ownership.delete_owned`` with the root's kept proof.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import stat as stat_mod
import time
from collections.abc import Sequence

from .._filelock import try_lock
from .._fsutil import (
    DIR_FD,
    O_NOFOLLOW,
    PRIVATE_DIR,
    PRIVATE_FILE,
    UTIME_BY_FD,
    Fingerprint,
    fingerprint,
    list_dir,
    open_dir,
    unlink_if_unchanged,
)
from .._winretry import replace_retry
from ..ownership import delete_owned
from ._owned import (
    AGED,
    DEAD_OR_ALIVE,
    WRITER_ALIVE,
    is_entry_file,
    is_shard,
    remake_dir,
    remove_foreign_owned,
    temp_kind,
    writer_of,
)

__all__ = ["PairWriter", "sweep_temps"]

_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | getattr(os, "O_BINARY", 0)


class PairWriter:
    """Stages files in ``tmp_dir`` and renames them into ``entries_dir/<shard>/``.

    The sidecar is published before the payload, so a reader that finds a new
    payload finds its sidecar too (or a newer one: a mismatch, hence a miss).
    Temp names carry the pid and a random tag, so processes never collide; call
    :meth:`renew` in a forked child.

    Where the platform allows (``DIR_FD``), ``tmp/``, ``entries/`` and the shard are
    opened without following links and every file operation is relative to those
    descriptors: a directory replaced by a symbolic link fails the write (ELOOP)
    instead of sending it elsewhere. A directory that was deleted is recreated (a
    recreated root is tagged). A foreign object where the shard or an entry file
    belongs is removed only when ``owned`` (the root's proof, see ``_owned``).
    """

    def __init__(
        self,
        tmp_dir: str,
        entries_dir: str,
        dir_mode: int | None,
        file_mode: int | None,
        *,
        owned: bool,
    ) -> None:
        self._tmp = tmp_dir
        self._entries = entries_dir
        self._root = os.path.dirname(tmp_dir)
        self._dir_mode = dir_mode
        self._file_mode = file_mode
        self._owned = owned
        self.renew()

    def renew(self) -> None:
        """A new writer identity (at init, and in a forked child: the inherited
        ``.alive`` descriptor shares the parent's lock and is the parent's)."""
        inherited = getattr(self, "_alive_fd", -1)
        if inherited >= 0:  # the parent's: closing our copy leaves its lock held
            with contextlib.suppress(OSError):
                os.close(inherited)
        owner = f"{os.getpid()}-{os.urandom(4).hex()}"
        self._owner = owner
        self._tag = f"{owner}." if DIR_FD else f"{owner}-"
        self._seq = itertools.count()
        self._alive_fd = -1
        self._alive_ino = -1

    def _ensure_alive(self, tfd: int) -> None:
        """Hold ``<owner>.alive`` locked in ``tmp/`` before any temp is made there (it is
        made again when ``tmp/`` was wiped: a sweeper must never see our temps ownerless)."""
        name = self._owner + ".alive"
        if self._alive_fd >= 0:
            with contextlib.suppress(OSError):
                if os.stat(name, dir_fd=tfd, follow_symlinks=False).st_ino == self._alive_ino:
                    return
            with contextlib.suppress(OSError):
                os.close(self._alive_fd)
            self._alive_fd = -1
        mode = PRIVATE_FILE if self._file_mode is None else self._file_mode
        fd = os.open(name + ".new", _O_NEW, mode, dir_fd=tfd)
        try:
            if not try_lock(fd):
                raise OSError(f"cannot lock {name}.new")
            os.replace(name + ".new", name, src_dir_fd=tfd, dst_dir_fd=tfd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name + ".new", dir_fd=tfd)
            raise
        self._alive_fd, self._alive_ino = fd, os.fstat(fd).st_ino

    def __del__(self) -> None:  # a handle dropped without close()
        with contextlib.suppress(Exception):
            self.close()

    def close(self) -> None:
        """Remove ``<owner>.alive`` (if it is still ours) and let go of its lock."""
        if self._alive_fd < 0:
            return
        with contextlib.suppress(OSError):
            name = os.path.join(self._tmp, self._owner + ".alive")
            if os.lstat(name).st_ino == self._alive_ino:
                os.unlink(name)
        with contextlib.suppress(OSError):
            os.close(self._alive_fd)
        self._alive_fd = -1

    def write_pair(
        self, shard: str, name: str, sidecar: str, data: bytes, side: bytes, durable: bool
    ) -> int:
        """Publish ``entries/<shard>/<name>`` and its ``sidecar``; return the bytes the
        replaced pair occupied (0 if none).

        Raises ``OSError`` on failure, leaving no temp file behind.
        """
        if not DIR_FD:  # Windows
            return self._write_pair_by_path(shard, name, sidecar, data, side, durable)
        tfd = self._anchor(self._tmp)
        efd = sfd = -1
        try:
            self._ensure_alive(tfd)
            efd = self._anchor(self._entries)
            sfd = self._shard(efd, shard)
            return self._stage_publish(tfd, sfd, name, sidecar, data, side, durable)
        finally:
            for fd in (sfd, efd, tfd):
                if fd >= 0:
                    os.close(fd)

    def write_pairs(
        self, items: Sequence[tuple[str, str, str, bytes, bytes]], durable: bool
    ) -> list[int | OSError]:
        """:meth:`write_pair` of each ``(shard, name, sidecar, data, side)``, in order;
        each one's answer: the bytes its replaced pair occupied, or the ``OSError``
        that stopped it (no temp of it left behind; the others go on).

        Each pair is staged and published exactly as :meth:`write_pair` does it -- its
        own temps, fsync'd with ``durable``, sidecar renamed before payload -- so a
        crash at any point leaves each entry whole and verifying, or absent, or its
        previous pair: never a new payload with an old sidecar that matches. What the
        batch shares is only the descriptors: ``tmp/``, ``entries/`` and each shard
        are opened once, and the writer's ``.alive`` lock is checked once. A pair
        whose write fails with those descriptors (a directory removed or replaced
        meanwhile) is written once more by :meth:`write_pair`, which opens them
        afresh -- so a batch answers what one write after another would. With
        ``durable``, each shard the batch renamed into is fsync'd once at the end, so
        the new names survive a host crash too (one write after another syncs no
        directory: after a crash such an entry may be absent, never torn).
        """
        if not DIR_FD or len(items) < 2:
            return [self._answer(item, durable) for item in items]
        out: list[int | OSError] = []
        tfd = efd = -1
        shards: dict[str, int] = {}
        try:
            tfd = self._anchor(self._tmp)
            self._ensure_alive(tfd)
            efd = self._anchor(self._entries)
            for item in items:
                shard, name, sidecar, data, side = item
                try:
                    sfd = shards.get(shard)
                    if sfd is None:
                        sfd = shards[shard] = self._shard(efd, shard)
                    out.append(self._stage_publish(tfd, sfd, name, sidecar, data, side, durable))
                except OSError:
                    out.append(self._answer(item, durable))  # afresh, as one write
        except OSError:
            out.extend(self._answer(item, durable) for item in items[len(out) :])
        finally:
            if durable:
                for fd in shards.values():
                    with contextlib.suppress(OSError):  # best effort: the entries are stored
                        os.fsync(fd)
            for fd in (*shards.values(), efd, tfd):
                if fd >= 0:
                    os.close(fd)
        return out

    def _answer(self, item: tuple[str, str, str, bytes, bytes], durable: bool) -> int | OSError:
        try:
            return self.write_pair(*item, durable)
        except OSError as exc:
            return exc

    def _stage_publish(
        self, tfd: int, sfd: int, name: str, sidecar: str, data: bytes, side: bytes, durable: bool
    ) -> int:
        """Stage both files in ``tmp/`` (``tfd``), then rename the sidecar, then the
        payload into the shard (``sfd``); the bytes the replaced pair occupied. Raises
        ``OSError``, leaving no temp behind."""
        tmp_payload: str | None = None
        tmp_side: str | None = None
        try:
            tmp_payload = self._write_temp(tfd, data, durable, True)
            tmp_side = self._write_temp(tfd, side, False, False)
            old = 0
            for dst in (name, sidecar):
                with contextlib.suppress(OSError):
                    st = os.stat(dst, dir_fd=sfd, follow_symlinks=False)
                    old += st.st_size if stat_mod.S_ISREG(st.st_mode) else 0
            _publish(tmp_side, sidecar, tfd, sfd, self._owned)
            tmp_side = None
            _publish(tmp_payload, name, tfd, sfd, self._owned)
            tmp_payload = None
            return old
        finally:
            for leftover in (tmp_payload, tmp_side):
                if leftover is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(leftover, dir_fd=tfd)

    def _anchor(self, path: str) -> int:
        """A no-follow descriptor on ``tmp/`` or ``entries/``, recreated if deleted."""
        try:
            return open_dir(path)
        except FileNotFoundError:
            remake_dir(path, self._root, self._dir_mode, self._file_mode)
            return open_dir(path)

    def _shard(self, efd: int, shard: str) -> int:
        try:
            return open_dir(shard, efd)
        except FileNotFoundError:
            pass
        except OSError:  # a file, FIFO or link where the shard belongs: not ours to use
            if not remove_foreign_owned(
                self._owned, shard, efd, is_shard, self._entries, files_too=True
            ):
                raise
        with contextlib.suppress(FileExistsError):  # shards are created lazily
            os.mkdir(shard, PRIVATE_DIR if self._dir_mode is None else self._dir_mode & 0o777,
                     dir_fd=efd)  # fmt: skip
        sfd = open_dir(shard, efd)
        if self._dir_mode is not None:
            with contextlib.suppress(OSError):  # made by another member: theirs to set
                os.fchmod(sfd, self._dir_mode)  # setgid and group bits whatever the umask
        return sfd

    def _write_temp(self, tfd: int, data: bytes, durable: bool, stamp: bool) -> str:
        """A new temp file in ``tmp/`` holding ``data``; its name. ``stamp``: give it
        :func:`_stamp`'s times (the payload: eviction ranks entries by its atime; a
        sidecar's times are never read but for an orphan's age, in minutes)."""
        name = f"{self._tag}{next(self._seq)}.tmp"
        fd = os.open(name, _O_NEW, PRIVATE_FILE if self._file_mode is None else self._file_mode,
                     dir_fd=tfd)  # fmt: skip
        try:
            self._fill(fd, data, durable, stamp)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=tfd)
            raise
        os.close(fd)
        return name

    def _fill(self, fd: int, data: bytes, durable: bool, stamp: bool) -> None:
        if self._file_mode is not None:
            os.fchmod(fd, self._file_mode)  # umask-independent group sharing
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if stamp and UTIME_BY_FD:
            _stamp(fd)
        if durable:
            os.fsync(fd)

    # -- platforms without dir_fd (Windows; tests force it to check the retries) ---------
    def _write_pair_by_path(
        self, shard: str, name: str, sidecar: str, data: bytes, side: bytes, durable: bool
    ) -> int:
        shard_path = os.path.join(self._entries, shard)
        written = self._write_temp_by_path(data, durable, True)
        tmp_payload: str | None = written
        tmp_side: str | None = None
        try:
            tmp_side = self._write_temp_by_path(side, False, False)
            old = 0
            for dst in (name, sidecar):
                with contextlib.suppress(OSError):
                    old += os.stat(os.path.join(shard_path, dst)).st_size
            self._publish_by_path(tmp_side, os.path.join(shard_path, sidecar), shard_path)
            tmp_side = None
            self._publish_by_path(written, os.path.join(shard_path, name), shard_path)
            tmp_payload = None
        finally:
            for leftover in (tmp_payload, tmp_side):
                if leftover is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(leftover)
        return old

    def _write_temp_by_path(self, data: bytes, durable: bool, stamp: bool) -> str:
        name = os.path.join(self._tmp, f"{self._tag}{next(self._seq)}.tmp")
        mode = PRIVATE_FILE if self._file_mode is None else self._file_mode
        try:
            fd = os.open(name, _O_NEW, mode)
        except FileNotFoundError:  # tmp/ was deleted under us: recreate it
            remake_dir(self._tmp, self._root, self._dir_mode, self._file_mode)
            fd = os.open(name, _O_NEW, mode)
        try:
            self._fill(fd, data, durable, stamp)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name)
            raise
        os.close(fd)
        if stamp and not UTIME_BY_FD:
            _stamp(name)
        return name

    def _publish_by_path(self, tmp: str, dst: str, shard: str) -> None:
        try:
            replace_retry(tmp, dst)
        except FileNotFoundError:
            if not os.path.exists(tmp):
                raise
            remake_dir(shard, self._root, self._dir_mode, self._file_mode)
            replace_retry(tmp, dst)


def _stamp(file: int | str) -> None:
    """Set a new file's atime and mtime from the clock that hits stamp atime with.

    Closes a race with eviction: a new file takes the kernel's coarser time, up to a
    tick behind that clock, so an entry stored just after hits looked least recently
    used, and the eviction its own write started removed it first. Best effort: a file
    system that refuses explicit times keeps the kernel's (the entry is still stored)."""
    now = time.time_ns()
    with contextlib.suppress(OSError):
        os.utime(file, ns=(now, now))


def _publish(tmp: str, name: str, tfd: int, sfd: int, owned: bool) -> None:
    """Rename ``tmp`` over ``name``; a directory standing there (a foreign object that
    would make the key unstorable for good) is removed first, then the rename retried."""
    try:
        os.replace(tmp, name, src_dir_fd=tfd, dst_dir_fd=sfd)
    except (IsADirectoryError, FileExistsError, OSError) as exc:
        if isinstance(exc, FileNotFoundError) or not remove_foreign_owned(
            owned, name, sfd, is_entry_file, "entries/"
        ):
            raise
        os.replace(tmp, name, src_dir_fd=tfd, dst_dir_fd=sfd)


def sweep_temps(tmp_dir: str, now_ns: int, stale_age_ns: int, *, owned: bool) -> int:
    """Delete the temp files of dead writers (at once) and other files writers make
    once older than ``stale_age_ns``; return the bytes of live writers' temps (they
    occupy the disk too). A writer is dead when its ``.alive`` file is gone or can be
    locked. Deletes nothing unless ``owned`` (the root's proof, ``_owned``); a name no
    writer makes is left alone and not counted."""
    if not DIR_FD:
        return _sweep_by_age(tmp_dir, now_ns, stale_age_ns, owned)
    try:
        tfd = open_dir(tmp_dir)
    except OSError:
        return 0
    owners: dict[str, bool] = {}  # writer -> alive
    held: list[int] = []  # .alive files of dead writers, locked until they are gone
    doomed: list[tuple[str, Fingerprint]] = []
    live = 0
    try:
        for name, st in list_dir(".", tfd):
            if not stat_mod.S_ISREG(st.st_mode):
                continue
            kind = temp_kind(name)
            if kind == DEAD_OR_ALIVE:
                if _alive(writer_of(name), tfd, owners, held):
                    live += st.st_size
                else:
                    doomed.append((name, fingerprint(st)))
            elif kind == WRITER_ALIVE:
                _alive(writer_of(name), tfd, owners, held)
            elif kind == AGED and st.st_mtime_ns < now_ns - stale_age_ns:
                doomed.append((name, fingerprint(st)))  # older layouts, leftovers
            elif kind:
                live += st.st_size
        for writer, alive in owners.items():
            if not alive:
                with contextlib.suppress(OSError):  # under its lock: still dead
                    st = os.stat(writer + ".alive", dir_fd=tfd, follow_symlinks=False)
                    doomed.append((writer + ".alive", fingerprint(st)))
        _remove(doomed, tfd, owned, tmp_dir)
    finally:
        for fd in held:
            os.close(fd)
        os.close(tfd)
    return live


def _remove(
    doomed: list[tuple[str, Fingerprint]], dir_fd: int | None, owned: bool, where: str
) -> int:
    """Stat-guarded removal of ``doomed`` through the ownership gate."""
    return delete_owned(
        doomed,
        lambda c: owned and temp_kind(os.path.basename(c[0])) != 0,
        lambda own: sum(unlink_if_unchanged(n, fp, dir_fd) for n, fp in own),
        where,
    ).removed


def _alive(owner: str, tfd: int, owners: dict[str, bool], held: list[int]) -> bool:
    """Whether ``owner``'s writer lives: its ``.alive`` file exists and is locked. A
    dead one's is kept locked (``held``) so no one mistakes it for live meanwhile."""
    known = owners.get(owner)
    if known is not None:
        return known
    try:
        fd = os.open(owner + ".alive", os.O_RDWR | O_NOFOLLOW, dir_fd=tfd)
    except FileNotFoundError:
        owners[owner] = False
        return False
    except OSError:
        owners[owner] = True  # cannot tell (read-only cache): never delete
        return True
    if try_lock(fd):
        held.append(fd)
        owners[owner] = False
        return False
    os.close(fd)
    owners[owner] = True
    return True


def _sweep_by_age(tmp_dir: str, now_ns: int, stale_age_ns: int, owned: bool) -> int:
    live = 0
    doomed: list[tuple[str, Fingerprint]] = []
    for name, st in list_dir(tmp_dir):
        if not stat_mod.S_ISREG(st.st_mode) or not temp_kind(name):
            continue
        if st.st_mtime_ns < now_ns - stale_age_ns:
            doomed.append((os.path.join(tmp_dir, name), fingerprint(st)))
        else:
            live += st.st_size
    _remove(doomed, None, owned, tmp_dir)
    return live
