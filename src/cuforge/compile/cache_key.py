"""Program cache keys: what ``make_program_cache_key`` (``cuforge.utils``) is made of.

The key is the first step of the compile cache, implemented in
``compile.cache._key`` with what it is made from: the compilers' identities
(``_identity``), the toolkit's headers (``_toolkit``) and the includes a C++ source
may read (``_includes``). This module is its public face: the names ``cuforge.utils``
exports, and ``program_key`` (the key of already-normalised inputs: the CLI's seam,
as ``Program``'s fast path computes it).
"""

from __future__ import annotations

# Where the key's inputs come from (what tests and tools patch to observe it).
from cuforge.compile.cache import _identity, _includes, _toolkit  # noqa: F401
from cuforge.compile.cache._key import (
    KEY_SCHEMA_VERSION,
    closed_flags,
    fingerprint_headers,
    make_program_cache_key,
    program_key,
    source_roots,
)

__all__ = [
    "KEY_SCHEMA_VERSION",
    "closed_flags",
    "fingerprint_headers",
    "make_program_cache_key",
    "program_key",
    "source_roots",
]
