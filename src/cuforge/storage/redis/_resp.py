"""A small synchronous Redis client for the hit path: RESP2 over one socket.

redis-py costs a fresh process ~80-150 ms to import (most of it ``redis.asyncio``,
which every release imports); a short-lived process that only looks an entry up --
the command line, a pytest worker, one rank of a job -- would pay that for a 1 ms
GET. This client speaks just what such a process needs with its own keys: ``GET``,
``GETEX … PX``, the pipelined ``HINCRBY`` of the fleet counters at close, the lease
scripts (``EVALSHA``) and blocking wait (``BLMOVE``) of single flight, and the
``SET`` of a fill, so neither a rank that waits for a peer's compile nor the peer
(whose waiters wait for its store) imports redis-py; ``_cluster`` routes the same
commands over a Redis Cluster. Everything else (scans, deletes, TLS clusters)
stays with redis-py, imported on first use.

- Connects on first use: TCP (``redis://``) or TLS (``rediss://``, with the URL's
  ``ssl_ca_certs`` / ``ssl_certfile`` / ``ssl_keyfile`` / ``ssl_cert_reqs``, host
  name checked when certificates are required, as redis-py does), then ``AUTH``
  as redis-py sends it for the same URL (``_auth_args``: a user name without a
  password is still that user) and ``SELECT`` as the URL asks.
- Every socket operation has a deadline: ``connect_timeout`` to connect, ``timeout``
  per command. A timeout, a reset or a malformed reply raises an ``OSError``
  (``TimeoutError``, ``ConnectionError``) and drops the connection, so a half-read
  reply can never be taken for the next command's answer.
- An error reply raises :class:`ReplyError` with the server's message (``READONLY``
  from a replica, ``WRONGPASS``); the connection stays usable.
- Threads never wait for each other: each command takes an idle connection or opens
  one (up to 8 are kept idle). A forked child must call :meth:`forget` (it must not
  share its parent's sockets).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import unquote, urlsplit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import BinaryIO

    #: How a caller has long values read in two: ``(peek, cut)`` -- see ``RespClient.pipeline``.
    Split = tuple[int, Callable[[bytes, int], int]]

__all__ = ["ReplyError", "RespClient", "client_for_url"]

_CRLF = b"\r\n"
# Never believe a reply that claims more than this (the server's proto-max-bulk-len).
_MAX_BULK = 512 << 20
# Idle connections kept for reuse (one per thread that looked up at the same time).
_MAX_IDLE = 8


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
        self._idle: list[_Conn] = []
        self._closed = False
        self._mutex = threading.Lock()

    # -- connections ----------------------------------------------------------------------
    def _connect(self) -> _Conn:
        # An ASCII host name goes to getaddrinfo as bytes: a str one is encoded with
        # the idna codec, whose import (stringprep, unicodedata) costs ~2.4 ms.
        host = self.host
        name: str | bytes = host.encode("ascii") if host.isascii() else host
        address = (name, self.port)  # getaddrinfo takes bytes (typeshed says str)
        sock = socket.create_connection(address, timeout=self._connect_timeout)  # type: ignore[arg-type]
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._wrap_tls(sock)
            sock.settimeout(self._timeout)
            conn = _Conn(sock)
            auth = _auth_args(self._username, self._password)
            if auth:
                _raise_first(conn.roundtrip([[b"AUTH", *auth]]))
            if self.db:
                _raise_first(conn.roundtrip([[b"SELECT", str(self.db).encode()]]))
            return conn
        except BaseException:
            with contextlib.suppress(OSError):
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

    def close(self) -> None:
        """Close the idle connections (one a thread is using closes when it returns)."""
        with self._mutex:
            idle, self._idle = self._idle, []
            self._closed = True
        for conn in idle:
            conn.close()

    def forget(self) -> None:
        """In a forked child: leave the parent's connections to the parent."""
        self._idle = []
        self._mutex = threading.Lock()

    # -- commands -------------------------------------------------------------------------
    def call(
        self, *args: bytes | str | int, timeout: float | None = None, split: Split | None = None
    ) -> object:
        """One command's reply (bytes, int, None, or a list); see :meth:`pipeline`."""
        return self.pipeline([args], timeout, split)[0]

    def pipeline(
        self,
        commands: Sequence[Sequence[bytes | str | int]],
        timeout: float | None = None,
        split: Split | None = None,
    ) -> list[object]:
        """Send ``commands`` in one write and read their replies in order, on an idle
        connection (a new one if none is idle: threads never wait for each other).
        ``timeout``: seconds the replies may take instead of the client's (a blocking
        command's). ``split = (peek, cut)``: each string value longer than ``peek``
        bytes is read as two, ``(head, tail)``, cut after ``cut(its first peek bytes,
        its length)`` bytes (a cut out of ``peek..length``: the head is the whole
        value, the tail empty) -- a caller that keeps the tail as it is (an entry's
        payload) copies no value again.

        Raises OSError when the connection fails (it is closed, never reused),
        ReplyError for the first error reply (after every reply has been read, so the
        connection stays in step and is reused).
        """
        return _raise_first(self.replies(commands, timeout, split))

    def replies(
        self,
        commands: Sequence[Sequence[bytes | str | int]],
        timeout: float | None = None,
        split: Split | None = None,
    ) -> list[object]:
        """:meth:`pipeline`, with an error reply in its place in the list (a
        ReplyError, not raised): what a caller that retries single commands needs."""
        with self._mutex:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        try:
            if timeout is not None:
                conn.sock.settimeout(timeout)
            try:
                replies = conn.roundtrip(commands, split)
            finally:
                if timeout is not None:
                    conn.sock.settimeout(self._timeout)
        except BaseException:
            conn.close()
            raise
        self._give_back(conn)
        return replies

    def _give_back(self, conn: _Conn) -> None:
        with self._mutex:
            if not self._closed and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()


class _Conn:
    """One socket and its buffered reader."""

    __slots__ = ("reader", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader: BinaryIO = sock.makefile("rb")

    def roundtrip(
        self, commands: Sequence[Sequence[bytes | str | int]], split: Split | None = None
    ) -> list[object]:
        """Send ``commands`` in one write, read every reply (an error reply is a
        ReplyError in the list; ``split``: see ``RespClient.pipeline``)."""
        self.sock.sendall(b"".join(_encode(c) for c in commands))
        return [_read(self.reader, split) for _ in commands]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.reader.close()
        with contextlib.suppress(OSError):
            self.sock.close()


def _auth_args(username: str | None, password: str | None) -> list[bytes]:
    """What follows ``AUTH`` for the URL's user and password -- exactly redis-py's
    choice, so both clients connect as the same user and a server refuses them alike:
    a user name goes with its password or ``""`` (``redis://ro@host``: the user ``ro``,
    not ``default`` -- a ``nopass`` user takes any password, a disabled one none);
    a password alone is the ``default`` user's; an empty password and no user send
    no ``AUTH`` at all. Empty list: connect without one."""
    if username:
        return [username.encode(), (password or "").encode()]
    return [password.encode()] if password else []


def _raise_first(replies: list[object]) -> list[object]:
    """``replies``, unless one is an error reply: then the first of them, raised."""
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


def _read(reader: BinaryIO, split: Split | None = None) -> object:
    """One reply; an error reply is returned as a ReplyError (not raised); with
    ``split``, a long string value as ``(head, tail)`` (see ``RespClient.pipeline``)."""
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
        if split is not None and size > split[0]:
            return _read_split(reader, size, split)
        data = reader.read(size)  # the value alone: a 32 KiB entry is not copied again
        if len(data) != size or reader.read(2) != _CRLF:
            raise ConnectionError("Redis connection closed in the middle of a reply")
        return data
    if kind == b"+":
        return body
    if kind == b":":
        return int(body)
    if kind == b"-":
        return ReplyError(body.decode("utf-8", "replace"))
    if kind == b"*":
        count = int(body)
        return None if count < 0 else [_read(reader, split) for _ in range(count)]
    raise ConnectionError(f"Redis sent an unknown reply type {kind!r}")


def _read_split(reader: BinaryIO, size: int, split: Split) -> tuple[bytes, bytes]:
    """A string value of ``size`` bytes as ``(head, tail)``, cut where ``split`` says."""
    peek, cut_at = split
    head = reader.read(peek)
    cut = cut_at(head, size) if len(head) == peek else size
    if not peek <= cut <= size:
        cut = size
    if cut > peek:
        head += reader.read(cut - peek)
    tail = reader.read(size - cut)
    if len(head) + len(tail) != size or reader.read(2) != _CRLF:
        raise ConnectionError("Redis connection closed in the middle of a reply")
    return head, tail


_TLS_OPTIONS = frozenset({"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"})


def client_for_url(
    url: str, options: Mapping[str, object], timeout: float, connect: float
) -> RespClient | None:
    """The hit path's small client for a plain ``redis://``/``rediss://`` URL whose
    options it understands, else None (redis-py serves everything)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or parts.query or parts.fragment:
        return None
    if not set(options) <= _TLS_OPTIONS:
        return None
    path = parts.path.strip("/") or "0"
    if not path.isdigit():
        return None
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    tls = {k: str(v) for k, v in options.items()} if parts.scheme == "rediss" else None
    if tls is None and options:
        return None
    return RespClient(
        parts.hostname or "localhost", parts.port or 6379, db=int(path), username=user,
        password=password, tls=tls, timeout=timeout, connect_timeout=connect,
    )  # fmt: skip
