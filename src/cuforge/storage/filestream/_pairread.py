"""Reading one file-stream entry: its sidecar, then its payload, verified together.

Guarantee: an entry is returned only when the sidecar read equals the one that
would be written for the payload and metadata read under the key asked for
(``_integrity``), so a torn, truncated, damaged or misplaced pair is never served.
The sidecar is read first and says how many payload bytes to read; a read
allocates what it asks for, so no length read off the disk is trusted beyond 1 MiB
(``_UNCHECKED``; metadata is capped there by ``parse_sidecar``): a larger payload
claim is bounded by the file's ``fstat`` size first. A flipped bit in a length
field is thus an integrity miss (a Mismatch), never a ``MemoryError`` under an
address-space limit (``ulimit -v``), and a hit of a payload under 1 MiB makes no
``fstat``. The files open ``O_NOFOLLOW | O_NONBLOCK`` relative to the shard's
descriptor (``_anchor``: no link is followed anywhere below the root, per access),
so a FIFO planted in place of a file never blocks, and a FIFO or directory there
reads as a Mismatch whose files the caller removes. Windows sharing violations are
retried (Windows opens by path).

Failure modes: a missing file is a miss (None: a writer between its two renames,
or a deleter); any other OS error is a miss reported to the caller's ``failed``; a
pair that does not verify is a :class:`Mismatch` naming both files' fingerprints
(for a stat-guarded removal) and the problem.
"""

from __future__ import annotations

import os
import stat as stat_mod
from collections import namedtuple
from collections.abc import Callable

from .._fsutil import DIR_FD, O_NOFOLLOW, Fingerprint, fingerprint
from .._integrity import (
    SIDECAR_READ,
    SIDECAR_SIZE,
    SIDECAR_SUFFIX,
    mismatch_problem,
    parse_sidecar,
    sidecar_for,
)
from .._winretry import _is_windows_sharing_violation, open_retry
from ..entry import CacheEntry
from ._anchor import EntriesAnchor
from ._hitmemo import HitMemo

__all__ = ["Mismatch", "PairNames", "read_pair"]

_O_READ = os.O_RDONLY | O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
_O_NOATIME = getattr(os, "O_NOATIME", 0)
_NOT_READABLE = Fingerprint(-1, 0, 0)
# A read of up to this many bytes is made as the sidecar says; a larger one is first
# bounded by the file's size (one fstat, small beside reading that much).
_UNCHECKED = 1 << 20


class PairNames(
    namedtuple("PairNames", ["payload", "sidecar", "shard", "key_digest", "seed", "name"])
):
    """One entry's file paths and the key binding its sidecar must carry."""

    __slots__ = ()
    payload: str
    sidecar: str
    shard: str  # the shard directory's name (2 hex digits)
    key_digest: bytes
    seed: int  # the CRC seed of key_digest (_integrity.key_seed)
    name: str  # the payload's file name in its shard (the sidecar's is name + suffix)


class Mismatch(namedtuple("Mismatch", ["payload_fp", "sidecar_fp", "problem"])):
    """A pair that was read and does not verify."""

    __slots__ = ()
    payload_fp: Fingerprint
    sidecar_fp: Fingerprint
    problem: str


def read_pair(
    names: PairNames,
    memo: HitMemo | None,
    failed: Callable[[OSError], None],
    anchor: EntriesAnchor | None = None,
) -> CacheEntry | Mismatch | None:
    """The entry if the pair verifies (remembered in ``memo`` unless None, its access
    time bumped when due); None if absent or unreadable (``failed`` is told why);
    else a Mismatch: the fingerprints of the two files read, for a guarded removal.
    With ``anchor`` (where ``DIR_FD``), files are opened relative to the shard."""
    if anchor is not None and DIR_FD:
        try:
            dfd = anchor.shard(names.shard)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a link or a file where the shard belongs
            failed(exc)
            return None
        try:
            return _read(names, memo, failed, names.name, names.name + SIDECAR_SUFFIX, dfd)
        finally:
            os.close(dfd)
    return _read(names, memo, failed, names.payload, names.sidecar, None)


def _read(
    names: PairNames,
    memo: HitMemo | None,
    failed: Callable[[OSError], None],
    payload: str,
    sidecar: str,
    dfd: int | None,
) -> CacheEntry | Mismatch | None:
    try:
        sfd = os.open(sidecar, _O_READ, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if dfd is not None or not _is_windows_sharing_violation(exc):
            failed(exc)
            return None
        try:
            sfd = open_retry(sidecar, _O_READ)
        except OSError as exc2:
            failed(exc2)
            return None
    fd = -1
    try:
        side = os.read(sfd, SIDECAR_READ)
        size, total = parse_sidecar(side)
        while len(side) <= total:  # metadata beyond the first read (rare; < 1 MiB)
            chunk = os.read(sfd, total + 1 - len(side))
            if not chunk:
                break
            side += chunk
        try:
            if memo is not None:
                fd = os.open(payload, _O_READ, dir_fd=dfd)
            else:
                fd = _open_quietly(payload, dfd)
        except FileNotFoundError:
            return None  # a writer between its two renames, or a deleter
        except OSError as exc:
            if dfd is not None or not _is_windows_sharing_violation(exc):
                failed(exc)
                return None
            fd = open_retry(payload, _O_READ)
        # The sidecar says how much to read (+1 to see a longer file); a claim too
        # large to take on trust is bounded by the file's size first.
        if size < _UNCHECKED:
            want, enough = size + 1, size
        else:
            want = _bounded(fd, size + 1)
            enough = want if want <= size else size
        data = os.read(fd, want)
        while len(data) < enough:
            chunk = os.read(fd, want - len(data))
            if not chunk:
                break
            data += chunk
        meta = side[SIDECAR_SIZE:total]
        if side == sidecar_for(names.key_digest, names.seed, data, meta):
            entry = CacheEntry(data, meta)
            if memo is not None:
                st = memo.bump_atime(fd, names.payload)
                if st is not None:
                    memo.remember(names.payload, fingerprint(st), entry)
            return entry
        return Mismatch(
            fingerprint(os.fstat(fd)),
            fingerprint(os.fstat(sfd)),
            mismatch_problem(side, data, names.key_digest),
        )
    except (IsADirectoryError, BlockingIOError):  # a directory, a FIFO with a writer
        payload_fp = _NOT_READABLE if fd < 0 else fingerprint(os.fstat(fd))
        return Mismatch(payload_fp, fingerprint(os.fstat(sfd)), "not a regular file")
    except OSError as exc:
        failed(exc)
        return None
    finally:
        if fd >= 0:
            os.close(fd)
        os.close(sfd)


def _open_quietly(payload: str, dfd: int | None) -> int:
    """Open a payload for a maintenance read (``verify``, ``prune``'s manifest reads;
    ``memo`` None) without the kernel updating its access time, which is the
    entry's last use: under ``relatime`` a read of a file whose atime is a day old
    moved it to now, so a daily ``cache verify`` kept every entry "used". Only a hit
    is a use. ``O_NOATIME`` is for the file's owner (or CAP_FOWNER): for others, and
    where the flag does not exist, the read is a plain one."""
    if _O_NOATIME:
        try:
            return os.open(payload, _O_READ | _O_NOATIME, dir_fd=dfd)
        except PermissionError:
            pass
    return os.open(payload, _O_READ, dir_fd=dfd)


def _bounded(fd: int, n: int) -> int:
    """``n``, or the size of the file ``fd`` if that is smaller: a length read off the
    disk may be damaged, and a read allocates what it asks for before it reads."""
    st = os.fstat(fd)
    return min(n, st.st_size) if stat_mod.S_ISREG(st.st_mode) else min(n, _UNCHECKED)
