"""Redis cache URLs: ``redis://``, ``rediss://`` (TLS), ``redis+cluster://``, ``rediss+cluster://``.

``redis://[[user]:password@]host[:port][/db]?prefix=..&ttl=7d&timeout=500ms...``:
the location is what redis-py's ``from_url`` reads; the query holds cuforge's
options (below) and, for ``rediss://``, the TLS files. Parsed here, opened by
:class:`cuforge.storage.redis.RedisProgramCache`. Named in ``storage.urls``'
scheme table and imported only when such a URL is opened.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..spec import CacheSpec, url_port

TYPE_CHECKING = False  # typing costs a cold process ~2 ms: not here
if TYPE_CHECKING:
    from typing import Any

    from ._cache import RedisProgramCache

__all__ = ["check_redis", "open_redis"]

_SSL_PARAMS = {"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"}
_CERT_REQS = ("none", "optional", "required")
_DURATIONS = ("ttl", "timeout", "connect_timeout", "lock_lease", "retry_after")


def check_redis(spec: CacheSpec) -> None:
    """What :func:`open_redis` refuses in the URL itself, checked without opening or
    connecting (``storage.urls.check_level``): ValueError naming the bad part."""
    _parsed(spec)


def _parsed(spec: CacheSpec) -> tuple[str, str, bool, dict[str, Any], dict[str, Any]]:
    """``(url without the database, database, cluster, TLS options, durations)``."""
    rest = spec.text.split("?", 1)[0].partition("://")[2]
    parts = urlsplit("redis://" + rest)
    try:
        url_port(parts.netloc)
    except ValueError as exc:
        raise spec.error(str(exc)) from None
    if not parts.hostname:
        raise spec.error(f"{spec.scheme}:// needs a host (e.g. {spec.scheme}://localhost:6379)")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise spec.error(f"database {path!r} is not a number (e.g. /0)")
    cluster = spec.scheme.endswith("+cluster") or spec.flag("cluster")
    if cluster and path not in ("", "0"):
        raise spec.error("Redis Cluster has only database 0")
    tls = spec.scheme.startswith("rediss")
    options: dict[str, Any] = {}
    for name in sorted(_SSL_PARAMS & spec.params.keys()):
        if not tls:
            raise spec.error(f"{name} needs TLS: use rediss://")
        options[name] = spec.text_param(name)
    if "ssl_cert_reqs" in options:  # read when connecting (both clients): checked now
        reqs = options["ssl_cert_reqs"] = options["ssl_cert_reqs"].lower()
        if reqs not in _CERT_REQS:
            raise spec.error(f"ssl_cert_reqs={reqs!r}: use none, optional or required")
    _prefix(spec)
    durations: dict[str, Any] = {n: v for n in _DURATIONS if (v := spec.duration(n)) is not None}
    url = f"{'rediss' if tls else 'redis'}{'+cluster' if cluster else ''}://{parts.netloc}"
    return url, path, cluster, options, durations


def _prefix(spec: CacheSpec) -> str:
    """``prefix=``'s value (``cuforge:`` when absent): not empty and without braces,
    which would make a hash tag of their own in the keys (``<prefix>{<id>}``)."""
    prefix = spec.text_param("prefix")
    if prefix is None:
        return "cuforge:"
    if "{" in prefix or "}" in prefix:
        raise spec.error(f"prefix={prefix!r}: braces are not allowed (keys are <prefix>{{<id>}})")
    return prefix


def open_redis(spec: CacheSpec) -> RedisProgramCache:
    """The RedisProgramCache ``spec`` names; ValueError naming the bad part."""
    from ._cache import RedisProgramCache

    url, path, cluster, options, durations = _parsed(spec)
    try:
        return RedisProgramCache(
            url + ("" if cluster else f"/{path or 0}"),
            prefix=_prefix(spec),
            cluster=cluster,
            read_only=spec.read_only,
            client_options=options,
            **durations,
        )
    except ValueError as exc:
        raise spec.error(str(exc)) from None
