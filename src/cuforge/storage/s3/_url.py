"""S3 cache URLs: ``s3://bucket[/prefix]?endpoint=..&region=..&path_style=1&timeout=2s``.

Credentials never travel in the URL (it ends up in logs, process lists and CI
configs): a URL with ``user:password@`` is refused; they come from the standard
AWS variables and profiles (see ``_creds``). Named in ``storage.urls``' scheme
table and imported only when such a URL is opened.
"""

from __future__ import annotations

from ..spec import CacheSpec
from ._endpoint import check_endpoint

TYPE_CHECKING = False  # typing costs a cold process ~2 ms: not here
if TYPE_CHECKING:
    from typing import Any

    from ._cache import S3ProgramCache

__all__ = ["PARAMS", "check_s3", "open_s3"]

_DURATIONS = ("timeout", "connect_timeout", "lock_lease", "retry_after")
#: The query parameters ``s3://`` accepts (besides ``ro``).
PARAMS = frozenset({"endpoint", "region", "path_style", *_DURATIONS})


def check_s3(spec: CacheSpec) -> None:
    """What :func:`open_s3` refuses in the URL itself, checked without opening
    (``storage.urls.check_level``): ValueError naming the bad part."""
    _parsed(spec)


def _parsed(spec: CacheSpec) -> tuple[str, str, dict[str, Any]]:
    """``(bucket, prefix, options)``."""
    bucket, _, prefix = spec.location.partition("/")
    if "@" in bucket:
        shown = f"s3://***@{bucket.rpartition('@')[2]}"  # never echo the secret
        raise ValueError(
            f"cache URL {shown!r}: credentials do not belong in the URL: set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
        )
    if not bucket:
        raise spec.error("s3:// needs a bucket (e.g. s3://my-bucket/cuforge)")
    spec.text_param("region")
    try:
        check_endpoint(spec.text_param("endpoint"))
    except ValueError as exc:
        raise spec.error(str(exc)) from None
    options: dict[str, Any] = {n: v for n in _DURATIONS if (v := spec.duration(n)) is not None}
    if "path_style" in spec.params:
        options["path_style"] = spec.flag("path_style")
    return bucket, prefix, options


def open_s3(spec: CacheSpec) -> S3ProgramCache:
    """The S3ProgramCache ``spec`` names; ValueError naming the bad part."""
    from ._cache import S3ProgramCache

    bucket, prefix, options = _parsed(spec)
    try:
        return S3ProgramCache(
            bucket,
            prefix=prefix or "cuforge/",
            endpoint=spec.text_param("endpoint"),
            region=spec.text_param("region"),
            read_only=spec.read_only,
            **options,
        )
    except ValueError as exc:
        raise spec.error(str(exc)) from None
