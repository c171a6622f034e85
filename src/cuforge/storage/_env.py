"""The environment variables that configure the default cache, read in one place.

``storage.config`` (which cache: the one selection) and ``storage.urls``
(``open_cache``'s ``secret=FROM_ENV``) both read them; this module imports only
``os``, so neither has to import the other, and ``storage.signing`` (hashlib, hmac)
is imported only when a secret is set.
"""

from __future__ import annotations

import os

__all__ = ["ENV_CACHE", "ENV_CACHE_DIR", "ENV_SECRET", "secret_from_env"]

#: A cache URL or directory, ``off``, or unset (``storage.config`` says what then).
ENV_CACHE = "CUFORGE_CACHE"
#: The older spelling of ``ENV_CACHE``, below it in precedence.
ENV_CACHE_DIR = "CUFORGE_CACHE_DIR"
#: The secret every shared level signs and verifies its entries with.
ENV_SECRET = "CUFORGE_CACHE_SECRET"


def secret_from_env() -> bytes | None:
    """``$CUFORGE_CACHE_SECRET`` as bytes, or None when unset or empty; ValueError
    naming the variable when it is too short."""
    raw = os.environ.get(ENV_SECRET)
    if not raw:
        return None
    from .signing import secret_bytes

    return secret_bytes(raw, f"${ENV_SECRET}")
