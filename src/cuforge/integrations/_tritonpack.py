"""One Triton kernel's files as one cuforge entry (a *pack*).

A compiled kernel is several files (its IRs, the cubin, the metadata JSON, the group
listing them); storing each as an entry of its own cost a store per file (the framing,
the signature, two files published, the size ledger) and a lookup per file on a hit.
A pack holds them all, so a kernel is one store and one lookup.

Layout: ``MAGIC``, one line of JSON (``[[name, size], ...]`` in the group's order), then
the files' bytes one after another. The cache verifies the entry as a whole (integrity
and signature) before :func:`unpack` sees it; :func:`unpack` still refuses anything
that is not exactly a pack -- another magic, a bad header, a name that is no plain file
name, sizes that do not add up to the entry's length -- by answering None (a miss).
"""

from __future__ import annotations

import json
import os

__all__ = ["MAGIC", "pack", "plain_name", "unpack"]

MAGIC = b"cuforge-triton-pack 1\n"


def plain_name(name: object) -> bool:
    """Whether ``name`` is a file name Triton may be given a path for: a non-empty
    str with no path separator or NUL, not ``.`` or ``..``."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and os.sep not in name
        and "\0" not in name
    )


def pack(files: list[tuple[str, bytes]]) -> bytes:
    """The pack of ``files`` (name, bytes), in that order. Raises ValueError for a
    name that is not :func:`plain_name` or a name given twice."""
    names = [n for n, _ in files]
    if len(set(names)) != len(names) or not all(plain_name(n) for n in names):
        raise ValueError(f"not a kernel's file names: {names!r}")
    header = json.dumps([[n, len(d)] for n, d in files], separators=(",", ":")).encode()
    return b"".join([MAGIC, header, b"\n", *(d for _, d in files)])


def unpack(raw: bytes | None) -> list[tuple[str, bytes]] | None:
    """The files of a pack, in its order, or None when ``raw`` is not exactly one."""
    if raw is None or not raw.startswith(MAGIC):
        return None
    end = raw.find(b"\n", len(MAGIC))
    if end < 0:
        return None
    try:
        header = json.loads(raw[len(MAGIC) : end])
    except ValueError:
        return None
    if not isinstance(header, list) or not header:
        return None
    out: list[tuple[str, bytes]] = []
    at = end + 1
    for item in header:
        if not (isinstance(item, list) and len(item) == 2 and plain_name(item[0])):
            return None
        name, size = item
        if type(size) is not int or size < 0 or at + size > len(raw):
            return None
        out.append((name, raw[at : at + size]))
        at += size
    if at != len(raw) or len({n for n, _ in out}) != len(out):
        return None
    return out
