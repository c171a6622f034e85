"""The environment variables that configure the default cache, read in one place,
and the one reader of a secret file.

``storage.config`` (which cache: the one selection) and ``storage.urls``
(``open_cache``'s ``secret=FROM_ENV``) both read them; this module imports only
``os``, so neither has to import the other, and ``storage.signing`` (hashlib, hmac)
is imported only when a secret is set.
"""

from __future__ import annotations

import os

__all__ = [
    "ENV_CACHE",
    "ENV_CACHE_DIR",
    "ENV_SECRET",
    "ENV_SECRET_FILE",
    "secret_file_from_env",
    "secret_from_env",
    "secret_from_file",
]

#: A cache URL or directory, ``off``, or unset (``storage.config`` says what then).
ENV_CACHE = "CUFORGE_CACHE"
#: The older spelling of ``ENV_CACHE``, below it in precedence.
ENV_CACHE_DIR = "CUFORGE_CACHE_DIR"
#: The secret every shared level signs and verifies its entries with.
ENV_SECRET = "CUFORGE_CACHE_SECRET"
#: A file holding that secret, below ``ENV_SECRET`` in precedence: how ``cuforge run``
#: hands its job a secret read from a file without putting the secret itself in the
#: job's environment.
ENV_SECRET_FILE = "CUFORGE_CACHE_SECRET_FILE"


def secret_file_from_env() -> str | None:
    """The file ``$CUFORGE_CACHE_SECRET_FILE`` names, absolute (``~`` expanded), so the
    same file is read after a ``chdir``; None when ``$CUFORGE_CACHE_SECRET`` is set
    (it wins) or the variable is unset or empty."""
    if os.environ.get(ENV_SECRET):
        return None
    path = os.environ.get(ENV_SECRET_FILE)
    if not path or not path.strip():
        return None
    return os.path.abspath(os.path.expanduser(path.strip()))


def secret_from_env() -> bytes | None:
    """``$CUFORGE_CACHE_SECRET`` as bytes, else the secret in the file
    ``$CUFORGE_CACHE_SECRET_FILE`` names (:func:`secret_from_file`); None when neither
    is set (an empty variable is unset). ValueError naming the variable (and the
    file) when the secret is too short or the file cannot be read."""
    raw = os.environ.get(ENV_SECRET)
    if raw:
        from .signing import secret_bytes

        return secret_bytes(raw, f"${ENV_SECRET}")
    path = secret_file_from_env()
    return None if path is None else secret_from_file(path, f"${ENV_SECRET_FILE} {path}")


def secret_from_file(path: str, source: str) -> bytes:
    """The secret the file ``path`` holds (UTF-8, surrounding whitespace dropped),
    checked as every secret is (``signing.secret_bytes``: 16 bytes or more). The one
    reader of a secret file: a settings file's ``secret_file`` and
    ``$CUFORGE_CACHE_SECRET_FILE`` alike. ValueError, one line starting with
    ``source`` (which names the file and where it was named), when the file cannot be
    read or the secret is too short."""
    from .signing import secret_bytes

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise ValueError(f"{source}: {why}") from None
    return secret_bytes(text, source)
