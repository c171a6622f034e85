"""A small synchronous Redis client for the hit path: RESP2 over one socket.

redis-py costs a fresh process ~80-150 ms to import (most of it ``redis.asyncio``,
which every release imports); a short-lived process that only looks an entry up --
the command line, a pytest worker, one rank of a job -- would pay that for a 1 ms
GET. This client speaks just what such a process needs with its own keys: ``GET``,
``GETEX … PX``, and the pipelined ``HINCRBY`` of the fleet counters at close.
Everything else (stores, locks, scans, scripts, Redis Cluster) stays with redis-py,
imported on first use.

- Connects on first use: TCP (``redis://``) or TLS (``rediss://``, with the URL's
  ``ssl_ca_certs`` / ``ssl_certfile`` / ``ssl_keyfile`` / ``ssl_cert_reqs``, host
  name checked when certificates are required, as redis-py does), then ``AUTH``
  (password, or user and password) and ``SELECT`` as the URL asks.
- Every socket operation has a deadline: ``connect_timeout`` to connect, ``timeout``
  per command. A timeout, a reset or a malformed reply raises an ``OSError``
  (``TimeoutError``, ``ConnectionError``) and drops the connection, so a half-read
  reply can never be taken for the next command's answer.
- An error reply raises :class:`ReplyError` with the server's message (``READONLY``
  from a replica, ``WRONGPASS``); the connection stays usable.
- One connection per client, used by one thread at a time (a lock); a forked child
  must call :meth:`forget` (it must not share its parent's socket).
"""

from __future__ import annotations

import contextlib
import socket
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import BinaryIO

__all__ = ["ReplyError", "RespClient"]

_CRLF = b"\r\n"
# Never believe a reply that claims more than this (the server's proto-max-bulk-len).
_MAX_BULK = 512 << 20


class ReplyError(Exception):
    """The server answered a command with an error (``-ERR …``)."""


class RespClient:
    """A connection to one Redis server; see the module docstring for the guarantees."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        tls: Mapping[str, str] | None = None,
        timeout: float,
        connect_timeout: float,
    ) -> None:
        self.host, self.port, self.db = host, port, db
        self._username, self._password = username, password
        self._tls = None if tls is None else dict(tls)
        self._timeout, self._connect_timeout = timeout, connect_timeout
        self._sock: socket.socket | None = None
        self._reader: BinaryIO | None = None
        self._mutex = threading.Lock()

    # -- connection ---------------------------------------------------------------------
    def _connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self._connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._wrap_tls(sock)
            sock.settimeout(self._timeout)
            self._sock = sock
            self._reader = sock.makefile("rb")
            if self._password is not None:
                auth = [b"AUTH", self._password.encode()]
                if self._username:
                    auth.insert(1, self._username.encode())
                self._roundtrip([auth])
            if self.db:
                self._roundtrip([[b"SELECT", str(self.db).encode()]])
        except BaseException:
            self._drop()
            sock.close()
            raise

    def _wrap_tls(self, sock: socket.socket) -> socket.socket:
        import ssl  # only for rediss://: ~10 ms

        tls = self._tls or {}
        reqs = tls.get("ssl_cert_reqs", "required").lower()
        modes = {
            "none": ssl.CERT_NONE,
            "optional": ssl.CERT_OPTIONAL,
            "required": ssl.CERT_REQUIRED,
        }
        if reqs not in modes:
            raise ValueError(f"ssl_cert_reqs must be none, optional or required, got {reqs!r}")
        context = ssl.create_default_context(cafile=tls.get("ssl_ca_certs"))
        context.check_hostname = modes[reqs] == ssl.CERT_REQUIRED
        context.verify_mode = modes[reqs]
        if tls.get("ssl_certfile"):
            context.load_cert_chain(tls["ssl_certfile"], tls.get("ssl_keyfile"))
        sock.settimeout(self._connect_timeout)
        return context.wrap_socket(sock, server_hostname=self.host)

    def _drop(self) -> None:
        sock, self._sock, self._reader = self._sock, None, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        with self._mutex:
            self._drop()

    def forget(self) -> None:
        """In a forked child: leave the parent's connection to the parent."""
        self._sock = self._reader = None
        self._mutex = threading.Lock()

    # -- commands -------------------------------------------------------------------------
    def call(self, *args: bytes | str | int) -> object:
        """One command's reply (bytes, int, None, or a list); see :meth:`pipeline`."""
        return self.pipeline([args])[0]

    def pipeline(self, commands: Sequence[Sequence[bytes | str | int]]) -> list[object]:
        """Send ``commands`` in one write and read their replies in order.

        Raises OSError when the connection fails (dropped), ReplyError for the first
        error reply (after every reply has been read, so the connection stays in step).
        """
        with self._mutex:
            if self._sock is None:
                self._connect()
            try:
                return self._roundtrip(commands)
            except ReplyError:
                raise
            except BaseException:
                self._drop()
                raise

    def _roundtrip(self, commands: Sequence[Sequence[bytes | str | int]]) -> list[object]:
        assert self._sock is not None and self._reader is not None
        self._sock.sendall(b"".join(_encode(c) for c in commands))
        replies = [_read(self._reader) for _ in commands]
        for reply in replies:
            if isinstance(reply, ReplyError):
                raise reply
        return replies


def _encode(args: Sequence[bytes | str | int]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        raw = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def _read(reader: BinaryIO) -> object:
    """One reply; an error reply is returned as a ReplyError (not raised)."""
    line = reader.readline(1 << 16)
    if not line.endswith(_CRLF):
        raise ConnectionError("Redis connection closed or sent a malformed reply")
    kind, body = line[:1], line[1:-2]
    if kind == b"$":
        size = int(body)
        if size < 0:
            return None
        if size > _MAX_BULK:
            raise ConnectionError(f"Redis reply claims {size} bytes")
        data = reader.read(size + 2)
        if len(data) != size + 2 or data[-2:] != _CRLF:
            raise ConnectionError("Redis connection closed in the middle of a reply")
        return data[:-2]
    if kind == b"+":
        return body
    if kind == b":":
        return int(body)
    if kind == b"-":
        return ReplyError(body.decode("utf-8", "replace"))
    if kind == b"*":
        count = int(body)
        return None if count < 0 else [_read(reader) for _ in range(count)]
    raise ConnectionError(f"Redis sent an unknown reply type {kind!r}")
