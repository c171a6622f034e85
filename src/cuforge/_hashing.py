"""``blake2b`` without importing ``hashlib``.

``hashlib`` loads OpenSSL when imported (about 3 ms of a cold process on a small
machine), and a cache hit from a fresh process needs only blake2b. CPython's
``hashlib.blake2b`` is this same ``_blake2.blake2b``; other interpreters get
hashlib's.
"""

from __future__ import annotations

try:
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - not CPython
    from hashlib import blake2b

__all__ = ["blake2b"]
