"""Maintenance reads that are no use: listing and checking entries without touching
the server's idle clock (the listing records and by-id reads of a Redis cache).

An entry's "last used" time is the server's idle time of its key (``OBJECT
IDLETIME``), which every read of the key resets -- so a ``cache ls`` or ``stats``
that reads the entries' headers made every entry look just used, and ``prune
--unused-for`` never found one to remove (nor would ``allkeys-lru`` evict it). Only
a hit is a use: maintenance reads run with ``CLIENT NO-TOUCH ON`` (Redis 7.2,
Valkey), which stops the commands of one connection from touching the keys they
read.

Each batch of reads is one pipeline on one connection: ``NO-TOUCH ON``, the reads,
``NO-TOUCH OFF``. The server runs the whole pipeline in order, so the mode never
outlives the batch on a connection that stays in use (one cut off midway is
dropped by the client, and the mode dies with it): a hit that reuses the pooled
connection afterwards still counts. A cluster's batch is split by the node that
serves each key (the switch is per connection, and a keyless command has no shard).

A server older than 7.2 (or a user whose ACL denies ``CLIENT``) refuses the
switch: its reads then reset the idle time, as every read there does, and the
handle stops asking. ``OBJECT IDLETIME``, ``EXISTS`` and ``SCAN`` never touch a key
on any version.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..entry import EntryInfo
from ..frame import LISTING_HEAD, Frame

__all__ = ["QuietReads", "by_node", "describe", "quiet_get"]


class QuietReads:
    """Runs pipelines of reads with the server's ``CLIENT NO-TOUCH`` on, where it has
    one; ``supported`` is None until the first batch tells."""

    __slots__ = ("supported",)

    def __init__(self) -> None:
        self.supported: bool | None = None

    def run(self, client: Any, fill: Callable[[Any], None]) -> list[Any]:
        """The replies of the commands ``fill(pipe)`` queues on a pipeline of
        ``client`` (a client of one server or cluster node), run without touching the
        keys. Error replies come back as exceptions; a failure to reach the server
        raises what the client raises."""
        pipe = client.pipeline(transaction=False)
        bracket = self.supported is not False
        if bracket:
            pipe.execute_command("CLIENT", "NO-TOUCH", "ON")
        fill(pipe)
        if bracket:
            pipe.execute_command("CLIENT", "NO-TOUCH", "OFF")
        replies = list(pipe.execute(raise_on_error=False))
        if not bracket:
            return replies
        self.supported = not isinstance(replies[0], Exception)
        return replies[1:-1]


def by_node(client: Any, cluster: bool, names: list[bytes]) -> Iterator[tuple[Any, list[bytes]]]:
    """``(client of one server, its names)``: the whole batch on a single server; on
    a cluster, the names grouped by the primary that serves each."""
    if not cluster:
        yield client, names
        return
    groups: dict[str, tuple[Any, list[bytes]]] = {}
    for name in names:
        node = client.get_node_from_key(name)
        found = groups.get(node.name)
        if found is None:
            found = groups[node.name] = (client.get_redis_connection(node), [])
        found[1].append(name)
    yield from groups.values()


def describe(
    node: Any, names: list[bytes], id_of: Callable[[bytes], str | None], quiet: QuietReads,
    frame: Frame,
) -> Iterator[EntryInfo]:  # fmt: skip
    """Listing records of ``names`` (entry names on the one server ``node`` is): one
    pipelined round trip, plus a GETRANGE per entry whose metadata outgrows the first
    read. A name gone since the SCAN is left out; a string of any length still there
    is listed (so ``verify`` names an emptied one). The last use is the key's idle
    time, which these reads leave as it was."""
    if not names:
        return

    def fill(pipe: Any) -> None:
        for name in names:
            pipe.object("idletime", name)  # never touches a key
            pipe.getrange(name, 0, LISTING_HEAD - 1)
            pipe.strlen(name)
            pipe.exists(name)  # STRLEN and GETRANGE answer 0 / b"" for a vanished key

    replies = quiet.run(node, fill)
    now = time.time_ns()
    for i, name in enumerate(names):
        idle, head, size, exists = replies[4 * i : 4 * i + 4]
        eid = id_of(name)
        if eid is None or isinstance(size, Exception) or exists != 1:
            continue
        stored, meta, need = frame.meta_of(head if isinstance(head, bytes) else b"")
        if meta is None and need:
            (more,) = quiet.run(node, functools.partial(_getrange, name=name, end=need))
            if isinstance(more, bytes):
                stored, meta, _ = frame.meta_of(more)
        stored = stored or now
        used = now - int(idle) * 1_000_000_000 if isinstance(idle, int) else stored
        yield EntryInfo(eid, int(size), stored, max(used, stored), meta)


def quiet_get(node: Any, name: bytes, quiet: QuietReads) -> bytes | None:
    """The value of ``name`` on ``node``, read without touching it."""
    (value,) = quiet.run(node, lambda pipe: pipe.get(name))
    if isinstance(value, Exception):
        raise value
    return value  # type: ignore[no-any-return]


def _getrange(pipe: Any, name: bytes, end: int) -> None:
    pipe.getrange(name, 0, end - 1)
