"""The S3 cache's handle, :class:`S3ProgramCache`: the storage core over the shared
remote driver (``storage.remote``) and this package's connection (``_store``).
Imported when the class is first used (``cuforge.storage.s3`` re-exports it lazily),
so that checking an ``s3://`` URL (``_url``) loads none of it."""

from __future__ import annotations

import os
from typing import Any

from ..remote import RemoteCache
from ..units import positive_seconds
from ._endpoint import check_endpoint
from ._store import S3Store, make_client, obstore_module

__all__ = ["S3ProgramCache"]


def _endpoint_options(endpoint: str | None) -> dict[str, Any]:
    """Client options for ``endpoint``; ValueError for one that is not a URL with a host
    (``_endpoint``, which checking an ``s3://`` URL runs too)."""
    if endpoint is None:
        return {}
    check_endpoint(endpoint)
    return {"allow_http": endpoint.startswith("http://")}


class S3ProgramCache(RemoteCache):
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
      other contents are replaced only with ``If-Match`` on the ETag read.
    - **One request per lookup** (a GET).
    - **Fails open and fast.** Requests time out after ``timeout`` s (connect:
      ``connect_timeout``), with no retries. A lookup that fails is a miss
      (``read_failures``), a store that fails is dropped (``write_failures``); the
      first failure warns once (a lookup: :class:`CacheReadWarning`, a store:
      :class:`CacheWriteWarning`) naming the cause -- a missing bucket, refused
      credentials, an unreachable server. After a failure to reach the server it is
      skipped for ``retry_after`` s (doubling up to ``max_retry_after``), so a hung
      server stalls a compile by about one ``timeout``. Maintenance calls raise
      ``ConnectionError`` instead.
    - **Single-flight across hosts**: ``lock(key)`` takes a lease object by
      conditional PUT, renewed while held; a crashed holder frees it within
      ``lock_lease`` s.
    - **Size**: object stores keep no access times, so there is no LRU here: bound
      the bucket with a lifecycle rule (expire ``<prefix>e/`` objects N days after
      creation) or ``cuforge cache prune --older-than / --max-size``.
    - **Only its own objects** are deleted (exact entry paths, counter objects, its
      own leases); ``read_only=True`` never writes: no stores, removals, leases or
      counters.
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "cuforge/",
        endpoint: str | None = None,
        region: str | None = None,
        path_style: bool | None = None,
        read_only: bool = False,
        timeout: float = 2.0,
        lock_lease: float = 30.0,
        retry_after: float = 1.0,
        connect_timeout: float = 0.5,
        max_retry_after: float = 30.0,
        stats_every: int = 256,
        stats_interval: float = 30.0,
    ) -> None:
        if not isinstance(bucket, str) or not bucket or "/" in bucket:
            raise ValueError(f"bucket must be a bucket name (no '/'), got {bucket!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        prefix = prefix.strip("/")
        prefix = prefix + "/" if prefix else ""
        self._bucket = bucket
        timeout = positive_seconds("timeout", timeout)
        connect_timeout = positive_seconds("connect_timeout", connect_timeout)
        lease_s = positive_seconds("lock_lease", lock_lease)
        where = f"s3://{bucket}/{prefix}" + (f" at {endpoint}" if endpoint else "")
        options = {
            "connect_timeout": f"{max(1, int(connect_timeout * 1000))}ms",
            **_endpoint_options(endpoint),
        }
        from ._creds import profile_settings

        settings = profile_settings()
        kwargs: dict[str, Any] = {
            k: v for k, v in settings.items()
            if k != "region" and not os.environ.get(f"AWS_{k.upper()}")
        }  # fmt: skip
        region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        region = region or settings.get("region") or "us-east-1"
        if endpoint is not None:
            kwargs["endpoint"] = endpoint
        if path_style is not None:
            kwargs["virtual_hosted_style_request"] = not path_style
        client = make_client(obstore_module(), bucket, region, options, kwargs)
        keyed = all(os.environ.get(f"AWS_{k.upper()}") or kwargs.get(k)
                    for k in ("access_key_id", "secret_access_key"))  # fmt: skip
        store = S3Store(prefix, where, client, timeout, lease_s, keyed=keyed)
        super().__init__(store, read_only, lease_s, (retry_after, max_retry_after),
                         (stats_every, stats_interval))  # fmt: skip

    @property
    def bucket(self) -> str:
        return self._bucket

    def __repr__(self) -> str:
        return f"S3ProgramCache({self._store.where!r})"
