"""The small client over a Redis Cluster: the hit path's commands, each sent to the
primary that owns its key's slot, without redis-py.

redis-py's cluster client costs a process its import (~100 ms), a start that reads
the slot map and the server's whole command table, and ~5-6 ms of CPU per kernel a
rank waits for in a herd (docs/scaling.md); a rank that only looks up, fills or
waits needs a handful of commands on one key each. This client speaks what
``_resp.RespClient`` speaks, routed:

- **Routing.** A command's key -- its first argument; a script's first key -- is
  hashed as the cluster does (CRC16 of the hash tag ``{...}`` when the key has one,
  modulo 16384) and sent to the primary the slot map names. The map is read with
  ``CLUSTER SLOTS`` from the URL's node (else from any node seen) on first use, and
  again after a ``MOVED`` answer or a lost connection. Each node is a ``RespClient``
  (the URL's user and password, the same timeouts); a pipeline's commands are sent
  to their nodes in one write each and the replies returned in order.
- **Redirections.** ``MOVED`` (the slot lives elsewhere now): the map is read again
  and the command sent to the node named, once; ``ASK`` (the slot is migrating):
  ``ASKING`` and the command to the node named, once. A second redirection, a slot
  no primary serves, ``CLUSTERDOWN`` or ``TRYAGAIN``: ``ConnectionError``, which the
  cache treats as an unreachable server (a miss, a dropped store, an unlocked fill;
  it backs off), as it treats redis-py's cluster errors.

Plain ``redis+cluster://`` URLs without options use it; TLS clusters and clients
passed in keep redis-py, as do listings, deletes and counters' reads everywhere.
"""

from __future__ import annotations

import threading
from binascii import crc_hqx
from urllib.parse import unquote, urlsplit

from ._resp import ReplyError, RespClient

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    Command = Sequence[bytes | str | int]

__all__ = ["ClusterClient", "cluster_client_for_url", "key_slot"]

SLOTS = 16384
#: Commands whose keys come after a script and a key count (``EVALSHA sha n k1 ...``).
_SCRIPTS = (b"EVALSHA", b"EVAL")
#: Answers that mean the cluster cannot serve the key now: an outage, not a refusal.
_DOWN = ("CLUSTERDOWN", "TRYAGAIN")


def key_slot(key: bytes) -> int:
    """The cluster slot of ``key`` (its hash tag's when it has a non-empty one)."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc_hqx(key, 0) % SLOTS


def _key_of(command: Command) -> bytes | None:
    """The key a command is routed by, or None (no key: any node serves it)."""
    name = command[0]
    name = name.upper() if isinstance(name, bytes) else str(name).upper().encode()
    at = 3 if name in _SCRIPTS else 1
    if name in _SCRIPTS and (len(command) < 3 or int(command[2]) < 1):
        return None
    if len(command) <= at:
        return None
    key = command[at]
    return key if isinstance(key, bytes) else str(key).encode()


class ClusterClient:
    """Primaries of one cluster behind ``RespClient``'s ``call``/``pipeline``; see the
    module docstring."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        username: str | None = None,
        password: str | None = None,
        timeout: float,
        connect_timeout: float,
    ) -> None:
        self._seed = (host, port)
        self._auth = (username, password)
        self._timeouts = (timeout, connect_timeout)
        self._nodes: dict[tuple[str, int], RespClient] = {}
        self._slots: list[tuple[str, int] | None] | None = None  # None: read it first
        self._mutex = threading.Lock()

    # -- nodes and the slot map ---------------------------------------------------------
    def _node(self, where: tuple[str, int]) -> RespClient:
        node = self._nodes.get(where)
        if node is None:
            with self._mutex:
                node = self._nodes.get(where)
                if node is None:
                    user, password = self._auth
                    timeout, connect = self._timeouts
                    node = RespClient(
                        where[0], where[1], username=user, password=password,
                        timeout=timeout, connect_timeout=connect,
                    )  # fmt: skip
                    self._nodes[where] = node
        return node

    def _read_map(self, first: tuple[str, int] | None = None) -> list[tuple[str, int] | None]:
        """The slot map, from ``first`` (else the URL's node), then any node seen;
        the last OSError when none answers."""
        tried: list[tuple[str, int]] = []
        failure: OSError | None = None
        for where in (first, self._seed, *list(self._nodes)):
            if where is None or where in tried:
                continue
            tried.append(where)
            try:
                reply = self._node(where).call(b"CLUSTER", b"SLOTS")
            except (OSError, ReplyError) as exc:
                failure = exc if isinstance(exc, OSError) else ConnectionError(str(exc))
                continue
            if not isinstance(reply, list):
                failure = ConnectionError(f"Redis Cluster: CLUSTER SLOTS answered {reply!r}")
                continue
            slots: list[tuple[str, int] | None] = [None] * SLOTS
            for row in reply:  # [start, end, [host, port, id, ...], replicas ...]
                start, end, primary = int(row[0]), int(row[1]), row[2]
                host = bytes(primary[0]).decode("ascii", "replace")
                if host == "":  # "the node you asked"
                    host = where[0]
                if host != "?":  # "?": not known, the slot unserved for now
                    slots[start : end + 1] = [(host, int(primary[1]))] * (end - start + 1)
            self._slots = slots
            return slots
        raise failure or ConnectionError("Redis Cluster: no node to read the slot map from")

    def _route(self, command: Command) -> RespClient:
        key = _key_of(command)
        slots = self._slots if self._slots is not None else self._read_map()
        if key is None:
            where = next((w for w in slots if w is not None), self._seed)
        else:
            found = slots[key_slot(key)]
            if found is None:
                raise ConnectionError(
                    f"Redis Cluster: slot {key_slot(key)} is served by no primary (CLUSTERDOWN)"
                )
            where = found
        return self._node(where)

    # -- commands -------------------------------------------------------------------------
    def call(self, *args: bytes | str | int, timeout: float | None = None) -> object:
        """One command's reply; see :meth:`pipeline`."""
        return self.pipeline([args], timeout)[0]

    def pipeline(self, commands: Sequence[Command], timeout: float | None = None) -> list[object]:
        """Each command sent to its slot's primary (one write per node), the replies in
        order. Raises OSError for a lost connection (the map is read again next
        time) or an outage answer, ReplyError for the first other error reply."""
        replies = self.replies(commands, timeout)
        for reply in replies:
            if isinstance(reply, ReplyError):
                raise reply
        return replies

    def replies(self, commands: Sequence[Command], timeout: float | None = None) -> list[object]:
        """:meth:`pipeline`, with an error reply in its place in the list."""
        out: list[object] = [None] * len(commands)
        groups: dict[int, tuple[RespClient, list[int]]] = {}
        try:
            for i, command in enumerate(commands):
                node = self._route(command)
                groups.setdefault(id(node), (node, []))[1].append(i)
            for node, at in groups.values():
                got = node.replies([commands[i] for i in at], timeout)
                for i, reply in zip(at, got, strict=True):
                    out[i] = reply
        except OSError:
            self._slots = None  # a node went away (a failover): read the map again
            raise
        for i, reply in enumerate(out):
            if isinstance(reply, ReplyError):
                out[i] = self._redirected(commands[i], reply, timeout)
        return out

    def _redirected(self, command: Command, error: ReplyError, timeout: float | None) -> object:
        """The reply after following ``error``'s redirection once; ``error`` itself
        when it is none; ConnectionError for an outage answer or a second one."""
        text = str(error)
        kind = text.split(" ", 1)[0]
        if kind in _DOWN:
            raise ConnectionError(f"Redis Cluster: {text}")
        if kind not in ("MOVED", "ASK"):
            return error
        host, _, port = text.split(" ")[2].rpartition(":")
        where = (host or self._seed[0], int(port))
        try:
            if kind == "MOVED":
                self._read_map(where)
                reply = self._node(where).replies([command], timeout)[0]
            else:
                reply = self._node(where).replies([(b"ASKING",), command], timeout)[1]
        except OSError:
            self._slots = None
            raise
        if isinstance(reply, ReplyError) and str(reply).split(" ", 1)[0] in (
            "MOVED", "ASK", *_DOWN,
        ):  # fmt: skip
            raise ConnectionError(f"Redis Cluster: redirected again ({reply})")
        return reply

    # -- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Close every node's idle connections."""
        for node in list(self._nodes.values()):
            node.close()

    def forget(self) -> None:
        """In a forked child: leave the parent's connections to the parent."""
        for node in list(self._nodes.values()):
            node.forget()
        self._mutex = threading.Lock()


def cluster_client_for_url(
    url: str, options: dict[str, object], timeout: float, connect: float
) -> ClusterClient | None:
    """The small client for a cluster at a plain ``redis://`` or ``redis+cluster://``
    URL without options (database 0), else None (redis-py serves it: TLS, say)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "redis+cluster") or parts.query or parts.fragment:
        return None
    if options or parts.path.strip("/") not in ("", "0"):
        return None
    return ClusterClient(
        parts.hostname or "localhost", parts.port or 6379,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        timeout=timeout, connect_timeout=connect,
    )  # fmt: skip
