"""The Redis connection of a cache: what ``storage.remote`` asks of a server, in Redis.

Keys on the server, for an entry whose id (``entry.entry_id``) is ``<id>``::

    <prefix>{<id>}                  the entry: one string, a frame with magic ``CFRE``
    <prefix>{<id>}:lock             its single-flight lease while someone compiles it
    <prefix>{<id>}:done:<token>     the holder's notice to waiters: a list, one element
    <prefix>stats                   fleet counters: a hash, one field per CacheStats counter

The ``{<id>}`` hash tag keeps an entry, its lease and its notices in one Redis
Cluster slot (one node), so every script touches one slot.

- **Lookups** are one ``GET`` (``GETEX … PX`` when reads renew a TTL; a replica
  that refuses it makes the handle read without renewing), through the small
  client ``_resp`` where it serves the URL, as are stores, leases and the waits of
  single flight: a process that hits, fills or waits never imports redis-py.
  Listings, deletes and a cluster use redis-py, imported on use.
- **Names it deletes** are proven first (``id_of``: exactly ``<prefix>{<64 lowercase
  hex digits>}``) and unlinked by a script only while they hold a string; a damaged
  value goes only if its header is still the one read. The prefix may hold other
  programs' keys: they stay.
- **Leases and waiting** (one script call each, so a waiter costs three requests
  per fill: take, wait, read): the take script returns the entry if it is there
  (a warm fleet: the one request of a lookup), else sets the lease ``NX PX`` with a
  random token, else answers the holder's token and the lease's time left. A waiter
  then blocks in ``BLMOVE <done> <done> RIGHT LEFT <time left + jitter>`` on the
  holder's notice list; the holder's release script deletes its lease (only with its
  token) and pushes one element, ``stored`` or ``free``: a list moved onto itself
  keeps its element, so one push wakes every waiter blocked on it and every late
  one, and it expires after a lease. A holder that dies pushes nothing: its waiters
  wake at the lease's expiry and take again (one wins, ``SET NX``). Renewal is a
  compare-and-set script too. Servers without ``BLMOVE`` (before 6.2) are waited on
  by taking again every 0.1 s.
- **Counters**: what a handle counted since its last flush, as pipelined
  ``HINCRBY``; a failed flush is retried with the next one.
- **Listings never touch an entry** (``_quiet``: ``CLIENT NO-TOUCH``, and the
  listing records it reads), so the idle time a listing reports is the last hit's.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..connection import Store
from ..entry import CacheEntry, EntryInfo, is_entry_id
from ..frame import PREFIX_SIZE, Frame
from ..lease import Busy, Claim, Held, expiry_jitter
from ..ownership import delete_owned
from ..stats import CacheStats
from ._quiet import QuietReads, by_node, describe, quiet_get
from ._resp import ReplyError, RespClient

if TYPE_CHECKING:
    from ._cluster import ClusterClient

__all__ = ["FRAME", "RedisStore", "redis_py"]

FRAME = Frame(b"CFRE", b"cuforge-redis-1", "value")
_SCAN_COUNT = 500
_FIELDS = tuple(CacheStats().as_dict())

#: Unlink KEYS[1] if it holds a string (what an entry is); a hash or list there stays.
_UNLINK_STRING = """
if redis.call('type', KEYS[1])['ok'] == 'string' then
    return redis.call('unlink', KEYS[1])
end
return 0
"""
_DEL_IF_SAME = (
    "if redis.call('getrange', KEYS[1], 0, ARGV[2]) == ARGV[1] then "
    "return redis.call('del', KEYS[1]) end return 0"
)
#: KEYS: entry, lock; ARGV: token, lease ms, TTL ms to renew a hit's (0: none), 1 to
#: answer an entry that is there first (else a free lease is taken regardless).
#: {1, value}: stored (read); {1}: stored; {2}: the lease is ours; {0, holder's
#: token, ms left}: busy.
_TAKE = """
if ARGV[4] == '1' then
    local v = redis.call('get', KEYS[1])
    if v then
        if ARGV[3] ~= '0' then redis.call('pexpire', KEYS[1], ARGV[3]) end
        return {1, v}
    end
end
if redis.call('set', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {2}
end
if ARGV[4] ~= '1' and redis.call('exists', KEYS[1]) == 1 then
    return {1}
end
return {0, redis.call('get', KEYS[2]) or '', redis.call('pttl', KEYS[2])}
"""
#: KEYS: lock, entry, done list; ARGV: token, ms the notice stays. Only our lease.
_RELEASE = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('del', KEYS[1])
local what = 'free'
if redis.call('exists', KEYS[2]) == 1 then what = 'stored' end
redis.call('rpush', KEYS[3], what)
redis.call('pexpire', KEYS[3], ARGV[2])
return 1
"""
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""

_SHA = {body: hashlib.sha1(body.encode()).hexdigest() for body in (_TAKE, _RELEASE, _RENEW)}
#: A notice stays at least this long (ms): a waiter between its take and its wait.
_NOTICE_MS = 5000
#: Without BLMOVE (Redis before 6.2): take again this often while waiting.
_NO_NOTICE_POLL_S = 0.1

_redis: Any = None  # redis-py, imported on first need (see _resp for why)


def redis_py() -> Any:
    """The redis module, imported now if it was not."""
    global _redis
    if _redis is None:
        import redis
        import redis.cluster
        import redis.exceptions

        _redis = redis
    return _redis


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisStore(Store):
    """One cache's keys under ``prefix`` on the server ``client`` (a redis-py client)
    or ``url`` (connected on first use) names; see the module docstring."""

    kind = "Redis"
    frame = FRAME

    def __init__(
        self,
        where: str,
        prefix: str,
        *,
        url: str | None,
        client: Any,
        cluster: bool,
        fast: RespClient | ClusterClient | None,
        options: dict[str, Any],
        timeouts: tuple[float, float],
        ttl_ms: int | None,
        read_only: bool,
    ) -> None:
        self.where, self.prefix, self._pre = where, prefix, prefix.encode()
        self._url, self._client, self.cluster, self._fast = url, client, cluster, fast
        self._options, self._timeouts, self.ttl_ms = options, timeouts, ttl_ms
        # A read-only handle never writes, not even a TTL renewal.
        self._refresh_ms = None if read_only else ttl_ms
        self._quiet = QuietReads()  # maintenance reads never count as a use
        self._mutex = threading.Lock()
        self._notices = True  # the server has BLMOVE (until it says otherwise)
        self.stats_name = self._pre + b"stats"
        if not cluster:  # a cluster's keys lie in different slots: one by one
            self.get_many = self._get_many
        self.put_many = self._put_many

    @property
    def errors(self) -> tuple[type[BaseException], ...]:  # type: ignore[override]
        found: tuple[type[BaseException], ...] = (OSError, ReplyError)
        if _redis is not None:
            found += (_redis.RedisError, _redis.exceptions.RedisClusterException)
        return found

    # -- the connection -------------------------------------------------------------
    def conn(self) -> Any:
        """The redis-py client, made on first use."""
        client = self._client
        if client is not None:
            return client
        with self._mutex:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _make_client(self) -> Any:
        assert self._url is not None
        redis = redis_py()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        timeout, connect = self._timeouts
        options: dict[str, Any] = {
            # RESP2, as the hit path's client speaks: both authenticate with the same
            # AUTH, so a server refuses them alike. Under RESP3 redis-py sends ``HELLO 3
            # AUTH default <password>``, which a server without a password accepts --
            # while the hit path's ``AUTH <password>`` gets "called without any
            # password configured": doctor and stats said fine, every compile failed.
            "protocol": 2,
            "socket_timeout": timeout,
            "socket_connect_timeout": connect,
            "retry": Retry(NoBackoff(), 0),  # fail fast: the breaker decides when to retry
            **self._options,
        }
        scheme, sep, rest = self._url.partition("://")
        url = scheme.replace("+cluster", "") + sep + rest
        if self.cluster:
            # Discovers the slot map now: raises if no node answers (caught by callers).
            return redis.cluster.RedisCluster.from_url(url, **options)
        return redis.Redis.from_url(url, **options)

    def problem(self, exc: BaseException) -> tuple[str, bool]:
        # An error answer (read-only replica, OOM, a refused AUTH) is no outage; a down
        # cluster is.
        refused = isinstance(exc, ReplyError) or (
            _redis is not None
            and isinstance(exc, (_redis.ResponseError, _redis.AuthenticationError))
            and not isinstance(exc, _redis.exceptions.ClusterError)
        )
        return f"{type(exc).__name__}: {exc}", refused

    def probe_read(self) -> None:
        self.conn().exists(self.stats_name)

    def probe_write(self) -> None:
        """``SETRANGE <prefix>stats 0 ""``: a write command (a replica, an ACL without
        write rights on the prefix or a full server refuses it before it runs) that
        sets nothing -- on an absent key or a string it changes nothing, and on the
        counters' hash it is a WRONGTYPE answer, which only a permitted write gets."""
        try:
            self.conn().setrange(self.stats_name, 0, b"")
        except redis_py().ResponseError as exc:  # a ready client: redis-py not loaded here
            if not str(exc).startswith("WRONGTYPE"):
                raise

    # -- names ----------------------------------------------------------------------
    def name(self, kd: bytes) -> bytes:
        return b"%s{%s}" % (self._pre, kd.hex().encode())

    def id_of(self, name: bytes) -> str | None:
        """Exactly ``<prefix>{<64 lowercase hex digits>}``: the entry id, else None."""
        if not name.startswith(self._pre):
            return None
        inner = name[len(self._pre) :]
        if len(inner) != 66 or inner[:1] != b"{" or inner[-1:] != b"}":
            return None
        eid = inner[1:-1].decode("ascii", "replace")
        return eid if is_entry_id(eid) else None

    # -- entries --------------------------------------------------------------------
    def get(self, name: bytes) -> tuple[bytes | None, None]:
        refresh = self._refresh_ms
        fast = self._fast
        if fast is not None:
            if refresh is None:
                return fast.call(b"GET", name), None  # type: ignore[return-value]
            try:
                return fast.call(b"GETEX", name, b"PX", refresh), None  # type: ignore[return-value]
            except ReplyError as exc:
                if not str(exc).startswith("READONLY"):
                    raise
                self._refresh_ms = None  # a replica: read without renewing TTLs
                return fast.call(b"GET", name), None  # type: ignore[return-value]
        client = self.conn()
        if refresh is None:
            return client.get(name), None
        try:
            return client.getex(name, px=refresh), None
        except _redis.exceptions.ReadOnlyError:
            self._refresh_ms = None
            return client.get(name), None

    def _get_many(self, names: list[bytes]) -> list[tuple[Any, None]]:
        """``get`` of each of ``names``, in one round trip; the small client reads each
        value cut before its payload (``(head, payload)``: ``Frame.cut``), so a
        batch's payloads are not copied again once read."""
        return [(value, None) for value in self._values(names)]

    def _values(self, names: list[bytes]) -> list[Any]:
        """The values of ``names`` in one round trip: one MGET, or -- when reads renew
        the TTL -- one pipeline of GETEX (a replica refusing it: an MGET)."""
        refresh = self._refresh_ms
        fast = self._fast
        if isinstance(fast, RespClient):  # a cluster's keys are read one by one
            cut = (PREFIX_SIZE, FRAME.cut)
            if refresh is not None:
                try:
                    getex = [(b"GETEX", n, b"PX", refresh) for n in names]
                    return list(fast.pipeline(getex, split=cut))
                except ReplyError as exc:
                    if not str(exc).startswith("READONLY"):
                        raise
                    self._refresh_ms = None
            values: Any = fast.call(b"MGET", *names, split=cut)
            return list(values)
        client = self.conn()
        if refresh is not None:
            pipe = client.pipeline(transaction=False)
            for n in names:
                pipe.getex(n, px=refresh)
            replies = pipe.execute(raise_on_error=False)
            if not any(isinstance(r, Exception) for r in replies):
                return list(replies)
            if not any("READONLY" in str(r) or "read only" in str(r) for r in replies):
                raise next(r for r in replies if isinstance(r, Exception))
            self._refresh_ms = None
        return list(client.mget(names))

    def put(self, name: bytes, value: bytes, entry: CacheEntry) -> bool:
        fast = self._fast
        if fast is not None:  # a fill's store: the waiters wait for it, not for an import
            fast.call(*self._set(name, value))
            return True
        self.conn().set(name, value, px=self.ttl_ms)
        return True

    def _set(self, name: bytes, value: bytes) -> tuple[bytes | int, ...]:
        ttl = self.ttl_ms
        return (b"SET", name, value) if ttl is None else (b"SET", name, value, b"PX", ttl)

    def _put_many(self, pairs: list[tuple[bytes, bytes]]) -> None:
        fast = self._fast
        if fast is not None:
            fast.pipeline([self._set(name, value) for name, value in pairs])
            return
        pipe = self.conn().pipeline(transaction=False)
        for name, value in pairs:
            pipe.set(name, value, px=self.ttl_ms)
        pipe.execute()

    def delete_if_same(self, name: bytes, value: bytes, token: Any) -> int:
        """Compare-and-delete on the server: the value's header and digest unchanged."""
        head = value[:PREFIX_SIZE]
        return int(self.conn().eval(_DEL_IF_SAME, 1, name, head, PREFIX_SIZE - 1))

    def unlink(self, names: list[bytes]) -> int:
        removed = 0
        for node, some in by_node(self.conn(), self.cluster, names):
            pipe = node.pipeline(transaction=False)
            for name in some:  # a script per key: one slot each
                pipe.eval(_UNLINK_STRING, 1, name)
            removed += sum(int(n) for n in pipe.execute())
        return removed

    # -- listing --------------------------------------------------------------------
    def names(self) -> Iterator[tuple[bytes, None]]:
        """Every string key the SCAN pattern ``<prefix>{*}`` matches."""
        match = _glob_escape(self.prefix) + "{*}"
        for name in self.conn().scan_iter(match=match, count=_SCAN_COUNT, _type="string"):
            yield name, None

    def describe(self, listed: list[tuple[bytes, None]]) -> Iterator[EntryInfo]:
        names = [name for name, _ in listed]
        for node, some in by_node(self.conn(), self.cluster, names):
            yield from describe(node, some, self.id_of, self._quiet, FRAME)

    def quiet_get(self, name: bytes) -> bytes | None:
        ((node, _),) = by_node(self.conn(), self.cluster, [name])
        return quiet_get(node, name, self._quiet)

    # -- leases ---------------------------------------------------------------------
    def _eval(self, body: str, keys: list[bytes], args: list[Any]) -> Any:
        """Run a script: through the small client (``EVALSHA``, ``EVAL`` the first time
        a server has not seen it) where it serves the URL, else redis-py's."""
        fast = self._fast
        if fast is None:  # one request to the key's node (a cluster's too), never a
            client = self.conn()  # SCRIPT LOAD to every node
            try:
                return client.evalsha(_SHA[body], len(keys), *keys, *args)
            except _redis.exceptions.NoScriptError:
                return client.eval(body, len(keys), *keys, *args)
        try:
            return fast.call(b"EVALSHA", _SHA[body], len(keys), *keys, *args)
        except ReplyError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            return fast.call(b"EVAL", body, len(keys), *keys, *args)

    def take(
        self, kd: bytes, entry: bytes, token: str, lease_s: float, expect_s: float | None,
        entry_first: bool,
    ) -> Claim:  # fmt: skip
        lock_name = entry + b":lock"
        args = [token, _ms(lease_s), self._refresh_ms or 0, int(entry_first)]
        reply = self._eval(_TAKE, [entry, lock_name], args)
        kind = int(reply[0])
        if kind == 1:
            return Claim(stored=True, value=bytes(reply[1]) if len(reply) > 1 else None)
        if kind == 2:
            return Claim(held=Held(lock_name, token, extra=max(_ms(lease_s), _NOTICE_MS)))
        holder, left_ms = bytes(reply[1]), int(reply[2])
        left = left_ms / 1000 if left_ms > 0 else lease_s  # no expiry: not ours to judge
        expires = time.monotonic() + left + expiry_jitter(lease_s)
        return Claim(busy=Busy(expires, tag=entry + b":done:" + holder if holder else None))

    def await_fill(
        self, kd: bytes, entry: bytes, busy: Busy, deadline: float, expect_s: float | None
    ) -> Claim | None:
        """Block on the holder's notice until its lease's expiry (plus jitter) or the
        deadline: ``stored`` ends the wait (the caller reads the entry), ``free`` or
        nothing means take again."""
        wait = min(busy.expires, deadline) - time.monotonic()
        if wait < 0.001:
            return None
        if busy.tag is None or not self._notices:
            time.sleep(min(wait, _NO_NOTICE_POLL_S))
            return None
        args = (b"BLMOVE", busy.tag, busy.tag, b"RIGHT", b"LEFT", b"%.3f" % wait)
        try:
            got = self._block(args, wait)
        except Exception as exc:
            if "unknown command" not in str(exc).lower():
                raise
            self._notices = False  # before Redis 6.2
            return None
        return Claim(stored=True) if got == b"stored" else None

    def _block(self, args: tuple[bytes, ...], wait: float) -> Any:
        """A blocking command that may take ``wait`` seconds: its reply may take that
        plus one command timeout (then the connection is dropped)."""
        read_s = wait + self._timeouts[0]
        fast = self._fast
        if fast is not None:
            return fast.call(*args, timeout=read_s)
        client = self.conn()
        if self.cluster:  # the node that owns the list's slot
            client = client.get_redis_connection(client.get_node_from_key(args[1]))
        pool = client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_command(*args)
            return conn.read_response(timeout=read_s)
        finally:
            pool.release(conn)

    def renew(self, held: Held, lease_s: float) -> bool:
        return bool(self._eval(_RENEW, [held.name], [held.token, _ms(lease_s)]))

    def release(self, held: Held) -> int:
        """Only this lease's own name, and (on the server) only with our token; the
        waiters are told whether the entry is there."""
        entry = held.name[: -len(b":lock")]
        done = entry + b":done:" + held.token.encode()
        return int(self._eval(_RELEASE, [held.name, entry, done], [held.token, held.extra]))

    # -- counters -------------------------------------------------------------------
    def send(self, counts: CacheStats, final: bool) -> None:
        delta = {n: v for n, v in counts.as_dict().items() if v}
        if not delta:
            return
        if self._fast is not None:  # the hit path's small client
            self._fast.pipeline([(b"HINCRBY", self.stats_name, f, v) for f, v in delta.items()])
            return
        pipe = self.conn().pipeline(transaction=False)
        for field, value in delta.items():
            pipe.hincrby(self.stats_name, field, value)
        pipe.execute()

    def fleet(self) -> CacheStats:
        """The fleet hash as CacheStats (fields of newer versions ignored)."""
        raw = self.conn().hgetall(self.stats_name)
        fields = {k.decode(): int(v) for k, v in raw.items() if k.decode() in _FIELDS}
        return CacheStats(**fields)

    def zero_fleet(self) -> None:
        delete_owned(  # the fleet hash, by its exact name only
            [self.stats_name], lambda n: n == self._pre + b"stats",
            lambda ns: int(self.conn().delete(*ns)), self.where,
        )  # fmt: skip

    # -- lifetime -------------------------------------------------------------------
    def close(self) -> None:
        if self._fast is not None:
            self._fast.close()
        if self._url is not None and self._client is not None:
            with contextlib.suppress(Exception):  # closing never fails the caller
                self._client.close()

    def after_fork(self) -> None:
        # redis-py's pools open fresh connections in a child by themselves.
        self._mutex = threading.Lock()
        if self._fast is not None:
            self._fast.forget()


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
