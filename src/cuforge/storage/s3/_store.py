"""The S3 connection of a cache: what ``storage.remote`` asks of a server, in objects.

Objects under the handle's ``prefix``, for an entry whose id is ``<id>``::

    <prefix>e/<id>              the entry: one object, a frame with magic ``CFS3``
    <prefix>locks/<id>          its single-flight lease while someone compiles it
    <prefix>stats/<ns>-<rand>   counters, one small object per flush (``_counters``)

- **Stores are conditional** (obstore's ``mode="create"``: ``If-None-Match: *``): of
  racing writers one uploads and the rest learn it from a 412; an entry that exists
  with other contents is replaced only with ``If-Match`` on the ETag just read, and
  an equal one is left as it is.
- **Leases** are objects ``<expiry_ns> <token> <start_ns> <expect_ms>`` (the holder's
  wall clock; the last two are when it took the lease and how long its last fill
  took, 0 if it knows none; older cuforge wrote the first two only): taken by
  conditional create, taken over when expired by a conditional overwrite naming the
  ETag read (of several waiters exactly one wins), renewed with ``If-Match`` on the
  holder's own ETag (a holder whose lease was taken over learns it and stops),
  deleted only while still ours. Keep hosts' clocks within a fraction of a lease.
- **Waiting** without a notification: a try GETs the lease, and creates it (a
  conditional PUT) only when there is none, so waiting for a held lease costs one GET
  and PUTs stay ~one per fill; a lock's try HEADs the entry when the lease is busy,
  a claim's try GETs the entry first instead (there, its bytes are handed over and
  no lease is taken; a claim that takes the lease GETs the entry once more, as a
  holder may have stored it and let go between the two requests).
  A waiter then GETs the entry on ``lease.Backoff``'s schedule from the holder's
  start, sized by the holder's hint (else this process's last fill, else 1 s),
  and takes again at the lease's expiry: one GET when the fill takes the E
  expected, about ``2 + log2(C / E)`` for a fill of C seconds. An entry found tells
  how long its fill took (its store time minus the lease's start, both the holder's
  clock): the next hint.
- **Deletes are proven**: only exact entry paths of this prefix, counter objects and
  this handle's own lease; the prefix is a folder of a bucket that may hold anything.
- **Timeouts, no retries**: a lookup's request times out after ``timeout`` (the
  breaker decides when to retry); maintenance requests wait up to 60 s.
- **fork()**: obstore's I/O runtime does not survive it (``_runtime``). The clients
  are made on first use, which marks the runtime started before any request; in a
  child of a process that sent one the store is ``broken`` (misses and dropped
  stores, never a hang). In a child of a process that sent none -- a command that
  opened the cache and then forked its workers, a pool forked at start-up -- the
  parent's clients are dropped unused and the child makes its own: the cache works.
  A client used before a fork is never used after it.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..connection import Store
from ..entry import CacheEntry, EntryInfo, is_entry_id
from ..frame import LISTING_HEAD, Frame
from ..lease import DEFAULT_FILL_S, Backoff, Busy, Claim, Held, expiry_jitter
from ..ownership import delete_owned
from ..stats import CacheStats
from . import _counters, _runtime

__all__ = ["FRAME", "S3Store"]

#: Where the client asks for credentials when none are in the environment or a
#: profile: EC2's instance metadata service (IPv4, IPv6) and ECS's container endpoint;
#: and wherever ``$AWS_METADATA_ENDPOINT`` (read by the client) points instead.
_METADATA_HOSTS = ("169.254.169.254", "[fd00:ec2::254]", "169.254.170.2")
_METADATA_ENV = "AWS_METADATA_ENDPOINT"


def _metadata_hosts() -> tuple[str, ...]:
    """The addresses a credential lookup that fell through may have asked."""
    configured = os.environ.get(_METADATA_ENV, "").strip()
    host = configured.partition("://")[2].split("/", 1)[0] if "://" in configured else ""
    return (*_METADATA_HOSTS, host) if host else _METADATA_HOSTS


def _asked_metadata(first: str) -> bool:
    """Whether an error's first line names a metadata address as a whole host (with
    its port, if it has one): ``127.0.0.1:1`` is not named by an error about
    ``127.0.0.1:19000``, nor ``169.254.170.2`` by one about ``169.254.170.20``."""
    import re  # only when a request failed

    return any(
        re.search(rf"(?<![\w.-]){re.escape(host)}(?![\w.-])", first) for host in _metadata_hosts()
    )


_NO_CREDENTIALS = (
    "no AWS credentials: none in the environment (AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY) or a profile (AWS_PROFILE), and the instance metadata "
    "service gave none"
)


def _refusal(first: str, text: str) -> str | None:
    """The server's refusal of a request (a 4xx status but throttling: 408, 429), in
    a phrase with its S3 error code and message; None for anything else (no status
    -- nothing answered --, a 5xx or throttling: an outage, backed off from)."""
    import re  # only when a request failed

    status = re.search(r"non-2xx status code: (4\d\d)( [^:<]*)?", first)
    if status is None or status.group(1) in ("408", "429"):
        return None
    said = [m.group(1).strip() for tag in ("Code", "Message")
            if (m := re.search(f"<{tag}>([^<]{{1,200}})</{tag}>", text))]  # fmt: skip
    answer = f"{status.group(1)}{(status.group(2) or '').rstrip()}"
    return f"the server refused the request ({': '.join([answer, *said])})"


FRAME = Frame(b"CFS3", b"cuforge-s3-1", "object")
#: Seconds a maintenance request (a listing page, a bulk delete) may take.
MAINTENANCE_TIMEOUT = 60.0
#: Objects per bulk DELETE: S3 allows 1,000, but a loaded server can take longer than
#: the request timeout to delete that many; 100 keep each request short.
DELETE_BATCH = 100
#: GET requests of one batched read in flight at once.
GET_CONCURRENCY = 16


def obstore_module() -> Any:
    try:
        import obstore
        import obstore.exceptions
        import obstore.store
    except ImportError:
        raise ImportError(
            "S3 caches need the obstore package: pip install 'cuforge[s3]' (or obstore>=0.6)"
        ) from None
    return obstore


def _expired(body: bytes) -> bool:
    head = body.split(b" ", 1)[0]
    # A lease body that does not parse (damaged, foreign) counts as expired.
    return not head.isdigit() or int(head) < time.time_ns()


def _lease_body(now_ns: int, lease_s: float, token: str, extra: tuple[int, int]) -> bytes:
    """``<expiry_ns> <token> <start_ns> <expect_ms>`` (module docstring)."""
    return b"%d %s %d %d" % (now_ns + int(lease_s * 1e9), token.encode(), extra[0], extra[1])


def _busy(body: bytes, lease_s: float) -> Busy:
    """What a live lease's body says, in this process's monotonic clock: when to take
    again (its expiry plus jitter), when the holder started, its hint; ``tag``: the
    start in the holder's clock (to measure the fill by its entry's store time)."""
    fields = body.split(b" ")
    now, wall = time.monotonic(), time.time_ns()
    expires = now + max(0, int(fields[0]) - wall) / 1e9 + expiry_jitter(lease_s)
    start_ns = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else 0
    expect_ms = int(fields[3]) if len(fields) > 3 and fields[3].isdigit() else 0
    started = None if not start_ns else now - min(max(0, wall - start_ns) / 1e9, lease_s * 4)
    return Busy(expires, started, expect_ms / 1000 if expect_ms else None, start_ns or None)


def _fill_of(value: bytes, start_ns: int | None) -> float | None:
    """How long the fill that stored ``value`` took (seconds, the holder's clock), or
    None when the lease said no start or the value is no frame."""
    peeked = FRAME.peek(value[:64])
    if start_ns is None or peeked is None or peeked[0] <= start_ns:
        return None
    return (peeked[0] - start_ns) / 1e9


class S3Store(Store):
    """One cache's objects under ``prefix`` in ``bucket``; ``client`` is how to make an
    obstore client: ``client(timeout_s)``."""

    kind = "S3"
    frame = FRAME

    def __init__(
        self,
        prefix: str,
        where: str,
        client: Any,
        timeout: float,
        lease_s: float,
        *,
        keyed: bool = False,
    ) -> None:
        #: Whether the client was given keys (the environment's or a profile's): it
        #: then never asks the metadata service, and "no AWS credentials" is never true.
        self.keyed = keyed
        self.obs = obstore_module()
        self.errors = (self.obs.exceptions.BaseError, OSError)
        self.prefix = prefix
        self._lease_s = lease_s
        self.where = where
        self._client = client
        self._timeout = timeout
        client(timeout)  # a bad setting raises here, at open, not at the first request
        self._mstore: Any = None
        self.folder = prefix + "stats/"
        # Forked from a process that used S3: fail open at once, never hang.
        self.broken = _runtime.FORKED if _runtime.elsewhere() else None
        self._pool: Any = None  # the threads of batched reads, made on first use
        self._pool_mutex = threading.Lock()
        self.get_many = self._get_many

    def __getattr__(self, name: str) -> Any:
        """``store``, the client of lookups and stores, made on its first use in this
        process (then a plain attribute: no cost per request). Marks obstore's runtime
        started here first, so that a child forked from now on never uses S3."""
        if name != "store":
            raise AttributeError(name)
        _runtime.mark()
        self.store = client = self._client(self._timeout)
        return client

    @property
    def mstore(self) -> Any:
        """The client of maintenance calls (listing, clear, statistics): never in a
        compile, and a bulk request to a busy server can outlast a lookup's timeout.
        Made on first use, which marks the runtime started, as ``store``."""
        if self._mstore is None:
            _runtime.mark()
            self._mstore = self._client(max(MAINTENANCE_TIMEOUT, self._timeout))
        return self._mstore

    def problem(self, exc: BaseException) -> tuple[str, bool | None]:
        """A missing bucket or refused credentials are the server's answer; a request
        the client could not sign because the credential lookup fell through to the
        instance metadata service (no keys in the environment or a profile: never when
        ``keyed``) and that gave none -- the error names a metadata address as a whole
        host, not as a prefix of the endpoint's -- was never sent (None): not "access
        denied", whatever status the metadata address answered with. Any other refusal
        (a 4xx status, such as ``InvalidBucketName``) is an answer too (no back-off; a
        store ``failed``, not ``unreachable``); anything else (no answer, a 5xx,
        throttling) is an outage."""
        text = str(exc)
        if "NoSuchBucket" in text:
            return "the bucket does not exist", True
        first = text.split("\n", 1)[0]
        if not self.keyed and _asked_metadata(first):
            return _NO_CREDENTIALS, None
        name = type(exc).__name__
        denied = ("403 Forbidden", "401 Unauthorized", "InvalidAccessKeyId",
                  "SignatureDoesNotMatch")  # fmt: skip
        if name in ("PermissionDeniedError", "UnauthenticatedError") or any(
            d in text for d in denied
        ):
            return "access denied (check the AWS credentials: AWS_ACCESS_KEY_ID, AWS_PROFILE)", True
        refused = _refusal(first, text)
        if refused is not None:
            return refused, True
        return f"{name}: {first[:300]}", False

    @property
    def _probe_path(self) -> str:
        """A lease name no key has (64 zeros): tiny if it ever exists."""
        return f"{self.prefix}locks/{'0' * 64}"

    def probe_read(self) -> None:
        """A GET (not a HEAD: a missing bucket is told apart only in a body)."""
        self.get(self._probe_path)

    def probe_write(self) -> None:
        """A PUT with ``If-Match`` on an ETag no object has: the server checks the
        rights of a store first (403), then refuses the condition (412, or 404 for an
        absent object), so nothing is written."""
        errors = self.obs.exceptions
        try:
            self.obs.put(self.store, self._probe_path, b"", mode={"e_tag": '"cuforge-probe"'})
        except (errors.PreconditionError, FileNotFoundError) as exc:
            if "NoSuchBucket" in str(exc):
                raise
        else:  # a server that ignores If-Match stored an empty object: take it back
            path = self._probe_path

            def remove(names: list[str]) -> int:
                self.obs.delete(self.store, names)
                return len(names)

            delete_owned([path], lambda name: name == path, remove, self.where)

    # -- names ----------------------------------------------------------------------
    def name(self, kd: bytes) -> str:
        return f"{self.prefix}e/{kd.hex()}"

    def id_of(self, path: str) -> str | None:
        """Exactly ``<prefix>e/<64 lowercase hex digits>``: the entry id, else None."""
        eid = path.rpartition("/")[2]
        return eid if path == f"{self.prefix}e/{eid}" and is_entry_id(eid) else None

    def _absent(self, exc: FileNotFoundError) -> None:
        """A missing object is an answer; a missing bucket is a failure (raised)."""
        if "NoSuchBucket" in str(exc):
            raise exc

    # -- entries --------------------------------------------------------------------
    def get(self, path: str) -> tuple[bytes | None, Any]:
        try:
            got = self.obs.get(self.store, path)
            return bytes(got.bytes()), got.meta.get("e_tag")
        except FileNotFoundError as exc:
            self._absent(exc)
            return None, None

    def _get_many(self, paths: list[str]) -> list[tuple[bytes | None, Any]]:
        """``get`` of each of ``paths``, at most ``GET_CONCURRENCY`` requests in flight
        (S3 has no batched GET); the first request that fails raises, as one ``get``
        would (the caller counts the whole batch as misses)."""
        if len(paths) < 2:
            return [self.get(p) for p in paths]
        pool = self._pool
        if pool is None:
            from concurrent.futures import ThreadPoolExecutor

            with self._pool_mutex:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(GET_CONCURRENCY, "cuforge-s3-get")
                pool = self._pool
        return list(pool.map(self.get, paths))

    def close(self) -> None:
        """Let the GET threads go (a batched read made them)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    def put(self, path: str, value: bytes, entry: CacheEntry) -> bool:
        """A conditional create; an entry that exists with other contents (a manifest
        that gained a variant, a damaged object, a new value) is replaced with
        ``If-Match`` on the ETag just read -- a writer that lost that race leaves the
        winner's entry -- and an equal one is left (False)."""
        obs, exc = self.obs, self.obs.exceptions
        try:
            obs.put(self.store, path, value, mode="create")
            return True
        except exc.AlreadyExistsError:
            pass
        try:
            found = obs.get(self.store, path)
        except FileNotFoundError:
            found = None  # removed meanwhile: create it again
        if found is None:
            mode: Any = "create"
        else:
            kd = bytes.fromhex(path.rpartition("/")[2])
            if FRAME.unpack(kd, bytes(found.bytes())) == entry:
                return False
            mode = {"e_tag": found.meta["e_tag"]}
        try:
            obs.put(self.store, path, value, mode=mode)
        except (exc.PreconditionError, exc.AlreadyExistsError):
            return False  # another writer replaced it first
        return True

    def delete_if_same(self, path: str, value: bytes, etag: Any) -> int:
        if etag is not None and self.obs.head(self.store, path).get("e_tag") != etag:
            return 0
        self.obs.delete(self.store, path)
        return 1

    def unlink(self, paths: list[str]) -> int:
        """Delete proven paths: one is looked at first (absent: 0), many (a listing's)
        go in bulk requests of DELETE_BATCH."""
        if len(paths) == 1:
            try:
                self.obs.head(self.mstore, paths[0])
            except FileNotFoundError as exc:
                self._absent(exc)
                return 0
        for start in range(0, len(paths), DELETE_BATCH):
            self.obs.delete(self.mstore, paths[start : start + DELETE_BATCH])
        return len(paths)

    # -- listing --------------------------------------------------------------------
    def names(self) -> Iterator[tuple[str, Any]]:
        for page in self.obs.list(self.mstore, prefix=self.prefix + "e/"):
            for obj in page:
                yield obj["path"], obj

    def describe(self, listed: list[tuple[str, Any]]) -> Iterator[EntryInfo]:
        """One ranged GET each (two for large metadata). Object stores keep no read
        times: the last use is the store time."""
        for path, obj in listed:
            eid = self.id_of(path)
            if eid is None:
                continue
            size = int(obj["size"])
            try:
                head = self._range(path, min(LISTING_HEAD, size) or 1)
            except FileNotFoundError:
                continue
            except self.obs.exceptions.BaseError:
                head = b""
            stored, meta, need = FRAME.meta_of(head)
            if meta is None and need and need <= size:
                stored, meta, _ = FRAME.meta_of(self._range(path, need))
            stored = stored or int(obj["last_modified"].timestamp() * 1e9)
            yield EntryInfo(eid, size, stored, stored, meta)

    def _range(self, path: str, end: int) -> bytes:
        return bytes(self.obs.get_range(self.mstore, path, start=0, end=end))

    def quiet_get(self, path: str) -> bytes | None:
        try:
            return bytes(self.obs.get(self.mstore, path).bytes())
        except FileNotFoundError as exc:
            self._absent(exc)
            return None

    # -- leases ---------------------------------------------------------------------
    def _take(self, path: str, token: str, body: bytes) -> tuple[str | None, bytes | None]:
        """``(the new lease's ETag, None)`` when this call took it, else ``(None, the
        lease's body as read)`` (None: no answer, or taken over by another meanwhile).

        The lease is read first and created only when there is none (taken over with
        ``If-Match`` when it expired): a waiter's try is one GET, and of the hosts
        that wait for one kernel only those that find no lease PUT -- S3 allows a key
        fewer PUTs than GETs per second."""
        obs, exc = self.obs, self.obs.exceptions
        mine = token.encode()
        found = self._read_lease(path)
        if found is not None:
            held, tag = found
            fields = held.split(b" ")
            if len(fields) > 1 and fields[1] == mine:
                return tag, None  # an earlier create of ours went through after all
            if not _expired(held):
                return None, held
            try:
                return str(obs.put(self.store, path, body, mode={"e_tag": tag})["e_tag"]), None
            except (exc.PreconditionError, exc.AlreadyExistsError, FileNotFoundError):
                return None, None  # another waiter took it over first
        try:
            return str(obs.put(self.store, path, body, mode="create")["e_tag"]), None
        except exc.AlreadyExistsError:
            pass  # created between the GET and the PUT: read whose it is
        except exc.GenericError:
            # No answer in time: some servers (SeaweedFS) hold racing conditional PUTs
            # of one object for a second or more. Not taken -- unless it was, which the
            # next try sees by our token in the body.
            return None, None
        found = self._read_lease(path)
        if found is None:
            return None, None  # released meanwhile: the next try creates it
        held, tag = found
        fields = held.split(b" ")
        if len(fields) > 1 and fields[1] == mine:
            return tag, None
        return None, held

    def _read_lease(self, path: str) -> tuple[bytes, str] | None:
        """The lease's body and ETag, or None when there is none."""
        try:
            found = self.obs.get(self.store, path)
        except FileNotFoundError as exc:
            self._absent(exc)
            return None
        return bytes(found.bytes()), str(found.meta["e_tag"])

    def take(
        self, kd: bytes, entry: str, token: str, lease_s: float, expect_s: float | None,
        entry_first: bool,
    ) -> Claim:  # fmt: skip
        if entry_first:
            value, _ = self.get(entry)
            if value is not None:
                return Claim(stored=True, value=value)
        path = f"{self.prefix}locks/{kd.hex()}"
        now = time.time_ns()
        extra = (now, 0 if expect_s is None else max(1, int(expect_s * 1000)))
        etag, seen = self._take(path, token, _lease_body(now, lease_s, token, extra))
        if etag is not None:
            held = Held(path, token, etag, extra)
            if entry_first:
                # The GET above and the create are two requests: a holder may have
                # stored the entry and released its lease between them (SeaweedFS
                # holds racing creates for a second), so look once more before
                # filling -- one GET per fill, not per waiter.
                value, _ = self.get(entry)
                if value is not None:
                    delete_owned([path], lambda n: n == path, lambda _: self.release(held), path)
                    return Claim(stored=True, value=value)
            return Claim(held=held)
        if not entry_first:
            try:
                self.obs.head(self.store, entry)
                return Claim(stored=True)
            except FileNotFoundError as exc:
                self._absent(exc)
        return Claim() if seen is None else Claim(busy=_busy(seen, lease_s))

    def await_fill(
        self, kd: bytes, entry: str, busy: Busy, deadline: float, expect_s: float | None
    ) -> Claim | None:
        """GET the entry on the back-off schedule (module docstring) until it is there,
        the lease's expiry (plus jitter: take again) or the deadline."""
        now = time.monotonic()
        start = now if busy.started is None else busy.started
        expect = busy.expect or expect_s or DEFAULT_FILL_S
        schedule = Backoff(start, expect, self._lease_s / 4)
        while True:
            at = schedule.next(now)
            if at >= busy.expires or at >= deadline:
                time.sleep(max(0.0, min(busy.expires, deadline) - now))
                return None
            time.sleep(at - now)
            value, _ = self.get(entry)
            if value is not None:
                return Claim(stored=True, value=value, fill_s=_fill_of(value, busy.tag))
            now = time.monotonic()

    def renew(self, held: Held, lease_s: float) -> bool:
        exc = self.obs.exceptions
        body = _lease_body(time.time_ns(), lease_s, held.token, held.extra)
        try:
            put = self.obs.put(self.store, held.name, body, mode={"e_tag": held.tag})
        except (exc.PreconditionError, FileNotFoundError):
            return False  # taken over after we lost it: no longer ours
        held.tag = str(put["e_tag"])
        return True

    def release(self, held: Held) -> int:
        if self.obs.head(self.store, held.name)["e_tag"] != held.tag:
            return 0  # taken over: the new holder's
        self.obs.delete(self.store, held.name)
        return 1

    # -- counters -------------------------------------------------------------------
    def send(self, counts: CacheStats, final: bool) -> None:
        wrote = _counters.write(self.obs, self.store, self.folder, counts)
        if wrote and final and _counters.fold_due():
            self._fold()

    def _fold(self) -> None:
        """Sum the counter objects into one when there are more than FOLD_OVER, under
        the stats lease (so two folders never both fold, and count twice, the same)."""
        listed = self.obs.list(self.mstore, prefix=self.folder)
        if sum(len(page) for page in listed) <= _counters.FOLD_OVER:
            return
        lock = f"{self.prefix}locks/stats"
        token = os.urandom(16).hex()
        extra = (time.time_ns(), 0)
        held = Held(lock, token, None, extra)
        held.tag = self._take(lock, token, _lease_body(extra[0], self._lease_s, token, extra))[0]
        if held.tag is None:
            return  # another process is folding
        try:
            total, paths = _counters.read_all(self.obs, self.mstore, self.folder)
            if len(paths) > _counters.FOLD_OVER:
                _counters.write(self.obs, self.mstore, self.folder, total)
                self._delete_counters(paths)
        finally:
            delete_owned([lock], lambda p: p == lock, lambda _: self.release(held), lock)

    def _delete_counters(self, paths: list[str]) -> None:
        folder = self.folder
        delete_owned(paths, lambda p: _counters.owns(folder, p), self.unlink, self.where)

    def fleet(self) -> CacheStats:
        return _counters.read_all(self.obs, self.mstore, self.folder)[0]

    def zero_fleet(self) -> None:
        self._delete_counters(_counters.read_all(self.obs, self.mstore, self.folder)[1])

    def after_fork(self) -> None:
        """In a forked child: the parent's clients are dropped unused (a child makes its
        own on first use); when the parent had sent a request (the runtime's threads
        are gone), the store is ``broken`` for good."""
        self.__dict__.pop("store", None)
        self._mstore = None
        if _runtime.elsewhere():
            self.broken = _runtime.FORKED
        self._pool = None  # the parent's threads: not in this process


def make_client(obs: Any, bucket: str, region: str, options: dict[str, Any],
                kwargs: dict[str, Any]) -> Any:  # fmt: skip
    """``client(timeout_s)``: an obstore S3 client whose requests time out after
    ``timeout_s`` seconds, with no retries (the breaker decides when to retry)."""

    def client(timeout: float) -> Any:
        no_wait = datetime.timedelta(0)
        retry = {
            "max_retries": 0,
            "backoff": {"init_backoff": no_wait, "max_backoff": no_wait, "base": 2.0},
            "retry_timeout": datetime.timedelta(seconds=timeout),
        }
        opts = {**options, "timeout": f"{max(1, int(timeout * 1000))}ms"}
        return obs.store.S3Store(
            bucket, region=region, client_options=opts, retry_config=retry, **kwargs
        )

    return client
