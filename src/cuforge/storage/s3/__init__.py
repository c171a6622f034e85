"""A program cache in an S3-compatible bucket (AWS S3, R2, MinIO, Ceph, SeaweedFS, ...).

``pip install 'cuforge[s3]'`` (obstore: ~10 ms to import, against ~170 ms for
boto3 -- short-lived processes pay it on every start). The handle (``_cache``) is
the storage core over the shared remote driver (``storage.remote``); this package
is only the S3 connection (``_store``: objects, conditional writes, lease objects;
``_runtime``: which process its client runtime runs in, across fork), its counter
objects (``_counters``), AWS profiles (``_creds``) and the URL opener (``_url``).
The cache never breaks a compile: see :class:`S3ProgramCache`.

This module imports nothing: its names load on first use, so that checking an
``s3://`` URL (``_url``, at every open of a tier that names one) costs only that
module, not the handle, the driver and the client.
"""

from __future__ import annotations

from cuforge import _lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._cache import S3ProgramCache as S3ProgramCache
    from ._runtime import forks_lose_s3 as forks_lose_s3

__all__ = ["S3ProgramCache", "forks_lose_s3"]

__getattr__, __dir__ = _lazy.exports(
    __name__,
    {"S3ProgramCache": "cuforge.storage.s3._cache", "forks_lose_s3": "cuforge.storage.s3._runtime"},
)
