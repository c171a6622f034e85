"""Key and value coercion shared by every backend.

Keys: ``bytes`` or ``str`` (UTF-8). Values in: ``bytes``, ``bytearray``,
``memoryview``, or an ObjectCode-like object (duck-typed: has ``code`` and
``code_type``) whose ``code`` is bytes-like or a path to the binary. Values out:
``bytes``. Storage never imports the compile layer, hence the duck typing.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from typing import Any

__all__ = ["coerce_key", "coerce_value"]


def coerce_key(key: Any) -> bytes:
    """Return ``key`` as bytes; ``TypeError`` naming ``key`` for any other type, and
    ``ValueError`` for a str that has no UTF-8 form (lone surrogates)."""
    if type(key) is bytes:
        return key
    if isinstance(key, str):
        try:
            return key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"cache key str is not valid Unicode ({exc.reason} at index {exc.start}); "
                "pass bytes, or a str without lone surrogates"
            ) from None
    if isinstance(key, bytes):
        return bytes(key)
    raise TypeError(f"cache key must be bytes or str, got key of type {type(key).__name__}")


def coerce_value(value: Any, op: str) -> bytes:
    """Return the bytes to store for ``value``.

    A path-backed ObjectCode is read now, so the cache holds the binary rather
    than a path that could move; a missing file raises ``FileNotFoundError``
    naming ``op`` and the path. Unsupported types raise ``TypeError``.
    """
    if type(value) is bytes:
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, memoryview):
        return value.tobytes()
    if hasattr(value, "code_type") and hasattr(value, "code"):
        code = value.code
        if isinstance(code, (bytes, bytearray)):
            return bytes(code)
        if isinstance(code, memoryview):
            return code.tobytes()
        if isinstance(code, (str, os.PathLike)):
            path = os.fspath(code)
            try:
                with open(path, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"{op}: the ObjectCode value is backed by the file {path}, which does not "
                    "exist; the cache reads path-backed ObjectCode when it is stored"
                ) from None
        raise TypeError(
            f"{op}: ObjectCode-like value has a code attribute of type "
            f"{type(code).__name__}; expected bytes or a path"
        )
    raise TypeError(
        f"{op}: cache value must be bytes, bytearray, memoryview or ObjectCode, "
        f"got {type(value).__name__}"
    )
