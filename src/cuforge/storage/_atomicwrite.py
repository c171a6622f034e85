"""Atomic publication of a (payload, sidecar) pair through a staging directory."""

from __future__ import annotations

import contextlib
import itertools
import os

from ._fsutil import make_dir
from ._winretry import replace_retry

__all__ = ["PairWriter"]

_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)


class PairWriter:
    """Stages files in ``tmp_dir`` and renames them into place.

    The sidecar is published before the payload, so a reader that finds a new
    payload finds its sidecar too (or a newer one: a mismatch, hence a miss).
    Temp names carry the pid and a random tag, so processes never collide; call
    :meth:`renew` in a forked child.
    """

    def __init__(self, tmp_dir: str, dir_mode: int | None, file_mode: int | None) -> None:
        self._tmp = tmp_dir
        self._dir_mode = dir_mode
        self._file_mode = file_mode
        self.renew()

    def renew(self) -> None:
        self._prefix = os.path.join(self._tmp, f"{os.getpid()}-{os.urandom(4).hex()}-")
        self._seq = itertools.count()

    def write_pair(
        self,
        payload_path: str,
        sidecar_path: str,
        shard: str,
        data: bytes,
        side: bytes,
        durable: bool,
    ) -> int:
        """Publish both files; return the bytes the replaced pair occupied (0 if none).

        Raises ``OSError`` on failure, leaving no temp file behind.
        """
        written = self._write_temp(data, durable)
        tmp_payload: str | None = written
        tmp_side: str | None = None
        try:
            tmp_side = self._write_temp(side, False)
            old = 0
            for path in (payload_path, sidecar_path):
                with contextlib.suppress(OSError):
                    old += os.stat(path).st_size
            self._publish(tmp_side, sidecar_path, shard)
            tmp_side = None
            self._publish(written, payload_path, shard)
            tmp_payload = None
        finally:
            for leftover in (tmp_payload, tmp_side):
                if leftover is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(leftover)
        return old

    def _write_temp(self, data: bytes, durable: bool) -> str:
        name = f"{self._prefix}{next(self._seq)}.tmp"
        try:
            fd = os.open(name, _O_NEW, 0o666)
        except FileNotFoundError:  # tmp/ was deleted under us: recreate it
            make_dir(self._tmp, self._dir_mode)
            fd = os.open(name, _O_NEW, 0o666)
        try:
            if self._file_mode is not None:
                os.fchmod(fd, self._file_mode)  # umask-independent group sharing
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name)
            raise
        os.close(fd)
        return name

    def _publish(self, tmp: str, dst: str, shard: str) -> None:
        try:
            replace_retry(tmp, dst)
        except FileNotFoundError:
            if not os.path.exists(tmp):
                raise
            make_dir(shard, self._dir_mode)  # shard directories are created lazily
            replace_retry(tmp, dst)
