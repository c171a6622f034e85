"""A program cache in an S3-compatible bucket (AWS S3, R2, MinIO, Ceph, SeaweedFS, ...).

``pip install 'cuforge[s3]'`` (obstore: ~10 ms to import, against ~170 ms for
boto3 -- short-lived processes pay it on every start). Objects under the handle's
``prefix``, for an entry whose id (``entry.entry_id``) is ``<id>``::

    <prefix>e/<id>              the entry: one object (layout in _frame)
    <prefix>locks/<id>          single-flight lease while someone compiles it (_lease)
    <prefix>stats/<ns>-<rand>   counters, one small object per flush (_stats)

The cache never breaks a compile: see :class:`S3ProgramCache`. The prefix is a
folder of a bucket that may hold anything else: whatever the cache deletes goes
through :func:`~cuforge.storage.ownership.delete_owned` with a proof that it is one
of the objects above, by its exact name (``_listing`` for entries, ``_stats`` for
counters, ``_lease`` for a lease).
"""

from __future__ import annotations

import contextlib
import datetime
import time
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from cuforge._stack import outside_level

from .. import events
from .._breaker import CircuitBreaker
from .._livehandles import LiveHandles
from .._values import coerce_key, coerce_value
from ..base import (
    DEFAULT_LOCK_TIMEOUT,
    CacheKey,
    CacheReadWarning,
    CacheValue,
    CacheWriteWarning,
    EntryCache,
    check_meta,
)
from ..entry import CacheEntry, key_digest
from ..ownership import delete_owned
from ..stats import CacheStats
from . import _frame as frame
from ._lease import poll_lease
from ._listing import EntryListing
from ._stats import FOLD_OVER, FleetCounters, read_all, write

__all__ = ["S3ProgramCache"]

_LIVE = LiveHandles()
#: Seconds a maintenance request (a listing page, a bulk delete) may take.
MAINTENANCE_TIMEOUT = 60.0
# The process that started obstore's I/O runtime: its threads do not survive fork(),
# so in a forked child every request would wait for good (new clients too).
_RUNTIME_PID: list[int] = []
_FORKED = "the S3 client does not work in a process forked after it was used"


def _obstore() -> Any:
    try:
        import obstore
        import obstore.exceptions
        import obstore.store
    except ImportError:
        raise ImportError(
            "S3 caches need the obstore package: pip install 'cuforge[s3]' (or obstore>=0.6)"
        ) from None
    return obstore


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _problem(exc: BaseException) -> tuple[str, bool]:
    """What a failed request means, in a phrase; and whether the server answered (an
    answer is no outage: no back-off)."""
    text = str(exc)
    if "NoSuchBucket" in text:
        return "the bucket does not exist", True
    name = type(exc).__name__
    denied = ("403 Forbidden", "401 Unauthorized", "InvalidAccessKeyId", "SignatureDoesNotMatch")
    if name in ("PermissionDeniedError", "UnauthenticatedError") or any(d in text for d in denied):
        return "access denied (check the AWS credentials: AWS_ACCESS_KEY_ID, AWS_PROFILE)", True
    first = text.split("\n", 1)[0]
    return f"{name}: {first[:300]}", False


class S3ProgramCache(EntryListing, EntryCache):
    """Program cache in an S3-compatible bucket, safe to share between any number of hosts.

    ``bucket``, ``prefix`` (folder inside it, ``cuforge/`` by default), ``endpoint``
    (``http://127.0.0.1:9000`` for a local server; AWS by default), ``region``,
    ``path_style`` (``bucket`` in the path rather than the host name). Credentials
    come from the standard AWS variables and profiles (``_creds``), never from here.

    Guarantees:

    - **Never a corrupt hit.** An entry is one object: header, blake2b digest over
      key + metadata + payload, metadata, payload. An object that does not verify is
      a miss, counted in ``integrity_failures``, and deleted (if writable).
    - **Conditional writes**: a store is a conditional PUT (``If-None-Match: *``);
      when an equal entry exists (a peer stored it first) the store is a no-op, and
      other contents are replaced only with ``If-Match`` on the ETag read (``_put``).
    - **One request per lookup** (a GET).
    - **Fails open and fast.** Requests time out after ``timeout`` s (connect:
      ``connect_timeout``), with no retries. A lookup that fails is a miss
      (``read_failures``), a store that fails is dropped (``write_failures``); the
      first failure warns once (a lookup: :class:`CacheReadWarning`, a store:
      :class:`CacheWriteWarning`) naming the cause -- a
      missing bucket, refused credentials, an unreachable server. After a failure
      to reach the server it is skipped for ``retry_after`` s (doubling up to
      ``max_retry_after``), so a hung server stalls a compile by about one
      ``timeout``. Maintenance calls raise ``ConnectionError`` instead.
    - **Single-flight across hosts**: ``lock(key)`` takes a lease object by
      conditional PUT, renewed while held; a crashed holder frees it within
      ``lock_lease`` s.
    - **Size**: object stores keep no access times, so there is no LRU here: bound
      the bucket with a lifecycle rule (expire ``<prefix>e/`` objects N days after
      creation) or ``cuforge cache prune --older-than / --max-size``.
    - ``read_only=True`` never writes: no stores, removals, leases or counters.
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "cuforge/",
        endpoint: str | None = None,
        region: str | None = None,
        path_style: bool | None = None,
        timeout: float = 2.0,
        connect_timeout: float = 0.5,
        lock_lease: float = 30.0,
        retry_after: float = 1.0,
        max_retry_after: float = 30.0,
        stats_every: int = 256,
        stats_interval: float = 30.0,
        read_only: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(bucket, str) or not bucket or "/" in bucket:
            raise ValueError(f"bucket must be a bucket name (no '/'), got {bucket!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        prefix = prefix.strip("/")
        self._prefix = prefix + "/" if prefix else ""
        self._bucket = bucket
        self._timeout = _positive("timeout", timeout)
        self._connect_timeout = _positive("connect_timeout", connect_timeout)
        self._lease_s = _positive("lock_lease", lock_lease)
        self._read_only = bool(read_only)
        self._breaker = CircuitBreaker(
            _positive("retry_after", retry_after), _positive("max_retry_after", max_retry_after)
        )
        self._where = f"s3://{bucket}/{self._prefix}" + (f" at {endpoint}" if endpoint else "")
        self._obs = _obstore()
        self._store = self._make_store(endpoint, region, path_style)
        self._fleet = FleetCounters(
            self._prefix + "stats/", stats_every, _positive("stats_interval", stats_interval)
        )
        self._warned = False
        self._closed = False
        import os

        if not _RUNTIME_PID:
            _RUNTIME_PID.append(os.getpid())
        # Forked from a process that used S3: fail open at once, never hang.
        self._forked = _RUNTIME_PID[0] != os.getpid()
        _LIVE.add(self)

    def _make_store(self, endpoint: str | None, region: str | None, path_style: bool | None) -> Any:
        import os

        from ._creds import profile_settings

        settings = profile_settings()
        options: dict[str, Any] = {
            "connect_timeout": f"{max(1, int(self._connect_timeout * 1000))}ms",
        }
        if endpoint is not None:
            if not endpoint.startswith(("http://", "https://")):
                raise ValueError(f"endpoint must start with http:// or https://, got {endpoint!r}")
            from urllib.parse import urlsplit

            try:
                if not urlsplit(endpoint).hostname:
                    raise ValueError
                _ = urlsplit(endpoint).port  # the client panics on a bad one at each request
            except ValueError:
                raise ValueError(
                    f"endpoint {endpoint!r} is not a URL with a host and port"
                ) from None
            options["allow_http"] = endpoint.startswith("http://")
        kwargs: dict[str, Any] = {
            k: v
            for k, v in settings.items()
            if k != "region" and not os.environ.get(f"AWS_{k.upper()}")
        }
        region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        region = region or settings.get("region") or "us-east-1"
        if endpoint is not None:
            kwargs["endpoint"] = endpoint
        if path_style is not None:
            kwargs["virtual_hosted_style_request"] = not path_style
        self._store_args = (region, options, kwargs)
        return self._store_with(self._timeout)

    def _store_with(self, timeout: float) -> Any:
        """A client whose requests time out after ``timeout`` s, with no retries."""
        region, options, kwargs = self._store_args
        no_wait = datetime.timedelta(0)
        retry = {
            "max_retries": 0,
            "backoff": {"init_backoff": no_wait, "max_backoff": no_wait, "base": 2.0},
            "retry_timeout": datetime.timedelta(seconds=timeout),
        }
        options = {**options, "timeout": f"{max(1, int(timeout * 1000))}ms"}
        store = self._obs.store.S3Store
        return store(
            self._bucket, region=region, client_options=options, retry_config=retry, **kwargs
        )

    @property
    def _mstore(self) -> Any:
        """The client of maintenance calls (listing, clear, prune, statistics): these
        never run in a compile, and a bulk request to a busy server can take longer
        than a lookup's ``timeout``, so they wait up to MAINTENANCE_TIMEOUT."""
        found = self.__dict__.get("_maintenance_store")
        if found is None:
            found = self._store_with(max(MAINTENANCE_TIMEOUT, self._timeout))
            self.__dict__["_maintenance_store"] = found
        return found

    # -- properties -----------------------------------------------------------------
    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def read_only(self) -> bool:
        return self._read_only

    def _path(self, kd: bytes) -> str:
        return f"{self._prefix}e/{kd.hex()}"

    # -- failure handling -------------------------------------------------------------
    def _failed(self, exc: BaseException, what: str) -> None:
        """Record a failed request: back off unless the server answered; warn once."""
        problem, answered = _problem(exc)
        retry = None if answered else self._breaker.failure()
        if self._warned:
            return
        self._warned = True
        after = (
            f"{what}s fail"
            if answered
            else f"lookups are misses and stores are skipped, retrying in {retry:g} s"
        )
        warnings.warn(
            f"cuforge S3 cache {self._where}: {what} failed ({problem}); {after}. "
            "Compiles are not affected. Later failures of this handle are counted in "
            "stats() (read_failures, write_failures) without a warning.",
            CacheReadWarning if what == "lookup" else CacheWriteWarning,
            stacklevel=outside_level(),
        )

    @contextlib.contextmanager
    def _maintenance(self, what: str) -> Iterator[None]:
        """Turns a failed request of a maintenance call into one ConnectionError."""
        if self._forked:
            raise ConnectionError(f"S3 cache {self._where}: could not {what} ({_FORKED})")
        try:
            yield
        except (self._obs.exceptions.BaseError, OSError) as exc:
            if isinstance(exc, FileNotFoundError) and "NoSuchBucket" not in str(exc):
                raise
            raise ConnectionError(
                f"S3 cache {self._where}: could not {what} ({_problem(exc)[0]})"
            ) from None

    # -- reads --------------------------------------------------------------------------
    def get_entry(self, key: CacheKey) -> CacheEntry | None:
        self._check_open()
        kd = key_digest(coerce_key(key))
        stats = self._stats
        if not self._allow():
            stats.misses += 1
            stats.read_failures += 1
            return None
        path = self._path(kd)
        try:
            got = self._obs.get(self._store, path)
            body = bytes(got.bytes())
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                stats.misses += 1
                stats.read_failures += 1
                self._failed(exc, "lookup")
                return None
            self._breaker.success()
            stats.misses += 1
            self._tick()
            return None
        except Exception as exc:  # every server problem is a miss
            stats.misses += 1
            stats.read_failures += 1
            self._failed(exc, "lookup")
            return None
        self._breaker.success()
        result = frame.unpack(kd, body)
        self._tick()
        if type(result) is CacheEntry:
            stats.hits += 1
            stats.bytes_read += len(result.data)
            return result
        stats.misses += 1
        stats.integrity_failures += 1
        self._drop(path, got.meta.get("e_tag"))
        return None

    def _drop(self, path: str, etag: str | None) -> None:
        """Delete a damaged object (at the entry path of the key just looked up: the
        ownership proof) unless it was replaced since it was read."""
        if self._read_only:
            return

        def remove(paths: list[str]) -> int:
            if etag is not None and self._obs.head(self._store, paths[0]).get("e_tag") != etag:
                return 0
            self._obs.delete(self._store, paths[0])
            return 1

        with contextlib.suppress(Exception):
            delete_owned([path], lambda p: self._id_of(p) is not None, remove, self._where)

    # -- writes -------------------------------------------------------------------------
    def __setitem__(self, key: CacheKey, value: CacheValue) -> None:
        self.set_entry(key, value)

    def set_entry(self, key: CacheKey, value: CacheValue, meta: bytes = b"") -> None:
        """Store ``value`` with ``meta`` unless the entry exists (write-once); a server
        problem is a counted, warned write failure."""
        self._check_open()
        kd = key_digest(coerce_key(key))
        data = coerce_value(value, "S3ProgramCache.__setitem__")
        check_meta(meta)
        stats = self._stats
        if self._read_only or not self._allow():
            stats.write_failures += 1
            if self._read_only:
                events.note_dropped(events.READ_ONLY, f"S3 cache {self._where} is read-only")
            else:
                events.note_dropped(events.UNREACHABLE, f"S3 {self._where}: backing off")
            return
        body = frame.pack(kd, data, meta, time.time_ns())
        try:
            if not self._put(kd, body, data, meta):
                self._breaker.success()  # a peer stored the same entry first
                self._tick()
                return
        except Exception as exc:  # a store never breaks the caller
            stats.write_failures += 1
            problem, answered = _problem(exc)
            events.note_dropped(
                events.FAILED if answered else events.UNREACHABLE, f"S3 {self._where}: {problem}"
            )
            self._failed(exc, "store")
            return
        self._breaker.success()
        stats.stores += 1
        stats.bytes_written += len(data)
        self._tick()

    def _put(self, kd: bytes, body: bytes, data: bytes, meta: bytes) -> bool:
        """Write ``body`` as ``kd``'s object; False when an equal entry is already there.

        A conditional create (``If-None-Match: *``): a program entry is the same bytes
        whoever compiles it, so of racing writers one uploads and the rest learn it
        from a 412. An entry that exists with other contents (a header manifest that
        gained a variant, a damaged object, a caller's new value) is replaced with
        ``If-Match`` on the ETag just read; a writer that lost that race leaves the
        winner's entry (both are complete, verified entries of this key).
        """
        obs, path = self._obs, self._path(kd)
        exc = obs.exceptions
        try:
            obs.put(self._store, path, body, mode="create")
            return True
        except exc.AlreadyExistsError:
            pass
        try:
            found = obs.get(self._store, path)
        except FileNotFoundError:
            found = None  # removed meanwhile: create it again
        if found is None:
            mode: Any = "create"
        else:
            if frame.unpack(kd, bytes(found.bytes())) == (data, meta):
                return False
            mode = {"e_tag": found.meta["e_tag"]}
        try:
            obs.put(self._store, path, body, mode=mode)
        except (exc.PreconditionError, exc.AlreadyExistsError):
            return False  # another writer replaced it first
        return True

    def __delitem__(self, key: CacheKey) -> None:
        self._check_writable()
        if not self.remove_entry(key_digest(coerce_key(key)).hex()):
            raise KeyError(key)

    # -- single-flight --------------------------------------------------------------------
    def lock(
        self, key: CacheKey, timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> AbstractContextManager[bool]:
        """Cross-host per-key lease; yields whether it is held.

        Threads of this process queue locally first, then one polls the bucket.
        Yields False at once when the server cannot be reached, as soon as the entry
        has been stored by the holder (look again: it is a hit), or after
        ``timeout`` seconds (None: no limit).
        """
        self._check_open()
        return self._hold(key_digest(coerce_key(key)), timeout)

    @contextlib.contextmanager
    def _hold(self, kd: bytes, timeout: float | None) -> Iterator[bool]:
        deadline = float("inf") if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._key_locks.hold(kd, timeout) as local:
            if not local or self._read_only:
                yield local
                return
            lease = None
            if self._allow():
                try:
                    lease, _ = poll_lease(
                        self._obs, self._store, f"{self._prefix}locks/{kd.hex()}",
                        self._path(kd), self._lease_s, deadline,
                    )  # fmt: skip
                    self._breaker.success()
                except Exception as exc:  # no lease: compile unlocked
                    self._failed(exc, "lock")
            if lease is None:
                yield False
                return
            try:
                yield True
            finally:
                lease.release()

    # -- statistics and lifetime ----------------------------------------------------------
    def _tick(self) -> None:
        if self._fleet.due():
            self._flush_stats()

    def _flush_stats(self, raise_errors: bool = False, fold: bool = False) -> None:
        """Write this handle's new counts; ``fold`` (at close and exit): now and then,
        when that wrote an object, fold the folder (``_stats``)."""
        if self._read_only:
            return
        try:
            wrote = self._fleet.flush(self._obs, self._store, self._stats)
            if wrote and fold and self._fleet.fold_due():
                self._fold()
        except Exception:
            if raise_errors:
                raise

    def total_stats(self) -> CacheStats:
        """Counters summed over every host and process that used this prefix (live
        handles contribute what they flushed: every ``stats_every`` operations,
        every ``stats_interval`` s, at close and at exit). Only reads: this handle's
        own unsent counts are written first, and nothing else is created."""
        self._check_open()
        with self._maintenance("read statistics"):
            self._flush_stats(raise_errors=True)
            total, _ = read_all(self._obs, self._mstore, self._fleet.folder)
            return total

    def _fold(self) -> None:
        """Sum the counter objects into one when there are more than FOLD_OVER, under
        the stats lease; the sum is read under it, so two folders never both fold
        (and so count twice) the same objects."""
        folder = self._fleet.folder
        listed = self._obs.list(self._mstore, prefix=folder)
        if sum(len(page) for page in listed) <= FOLD_OVER:
            return
        lock = f"{self._prefix}locks/stats"
        lease, _ = poll_lease(self._obs, self._store, lock, lock, self._lease_s, 0.0)
        if lease is None:
            return  # another process is folding
        try:
            total, paths = read_all(self._obs, self._mstore, folder)
            if len(paths) > FOLD_OVER:
                write(self._obs, self._mstore, folder, total)
                delete_owned(paths, self._fleet.owns, self._delete, self._where)
        finally:
            lease.release()

    def zero_stats(self) -> None:
        """Restart the fleet's counters from zero for every host using this prefix:
        the counter objects are deleted (live handles elsewhere go on writing only
        what they count from their last flush). Raises PermissionError on a
        read-only handle, ConnectionError when the bucket cannot be reached."""
        self._check_writable()
        with self._maintenance("reset statistics"):
            self._flush_stats(raise_errors=True)
            _, paths = read_all(self._obs, self._mstore, self._fleet.folder)
            delete_owned(paths, self._fleet.owns, self._delete, self._where)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("operation on a closed S3ProgramCache")

    def _check_writable(self) -> None:
        self._check_open()
        if self._read_only:
            raise PermissionError(f"S3 cache {self._where} was opened read-only")

    def _flush_at_exit(self) -> None:
        if not self._closed and not self._forked and self._breaker.allow():
            self._flush_stats(fold=True)

    def _allow(self) -> bool:
        """Whether a request may go out now: not in a forked child (see _RUNTIME_PID;
        the first refusal warns, each is counted by the caller), and the breaker
        closed or probing."""
        if self._forked:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"cuforge S3 cache {self._where}: {_FORKED}; lookups are misses and "
                    "stores are skipped in this process (start it with the 'spawn' or "
                    "'forkserver' method to use the cache). Compiles are not affected.",
                    CacheReadWarning,
                    stacklevel=outside_level(),
                )
            return False
        return self._breaker.allow()

    def _after_fork_in_child(self) -> None:
        self._forked = True
        self._stats = CacheStats()
        self._fleet.reset()

    def close(self) -> None:
        """Write the counters. Idempotent."""
        if self._closed:
            return
        if not self._forked and self._breaker.allow():
            self._flush_stats(fold=True)
        self._closed = True
        _LIVE.discard(self)

    def __repr__(self) -> str:
        return f"S3ProgramCache({self._where!r})"
