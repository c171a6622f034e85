"""An S3 endpoint's form: the one check :class:`S3ProgramCache` and the ``s3://`` URL
check (``_url``) share, so a URL is refused before opening exactly where opening
would refuse it. Imports no client (checking a URL must stay light)."""

from __future__ import annotations

from ..spec import url_port

__all__ = ["check_endpoint"]


def check_endpoint(endpoint: str | None) -> None:
    """ValueError unless ``endpoint`` is None or an ``http://``/``https://`` URL with
    a host and, if it names one, a port 1-65535 (the client panics on a bad port at
    each request). What :class:`S3ProgramCache` refuses; ``_url.check_s3`` runs it too."""
    if endpoint is None:
        return
    if not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"endpoint must start with http:// or https://, got {endpoint!r}")
    from urllib.parse import urlsplit  # only for an endpoint: ~2 ms of a cold process

    parts = urlsplit(endpoint)
    try:
        url_port(parts.netloc)
    except ValueError as exc:
        bad = f"endpoint {endpoint!r} is not a URL with a host and a valid port"
        raise ValueError(f"{bad} ({exc})") from None
    if not parts.hostname:
        raise ValueError(f"endpoint {endpoint!r} is not a URL with a host (a port is optional)")
