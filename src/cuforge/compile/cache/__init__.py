"""The cache behind ``Program.compile(cache=)``: its pipeline and what it reads and writes.

    key -> (manifest: a variant that still holds, when headers are tracked) -> lookup
        -> compile -> store

``_pipeline`` runs the steps in one straight line (no callbacks); ``_steps`` turns
an entry into an ObjectCode and a compile into a stored entry (through
``storage.failopen``); ``_tracking`` holds the manifest steps for C++ that reads
headers (``_includes`` scans and resolves them, ``_manifest`` keeps their variants,
``_watch`` proves them unchanged without reading them); ``_records`` is the record
stored with each entry; ``_identity`` and ``_identity_store`` name the compiler a key
is made from. The key itself is ``compile.cache_key``.

The seam for the layers above (the CLI): :func:`compile_through_cache` (the pipeline
with what it did: :class:`Compiled`), :func:`tracks_headers`, :func:`read_files`
(the user files a compile reads), :func:`pipeline`.
Names resolve on first use: importing a submodule (``_identity_store`` on the CLI's
hit path) loads only that one.
"""

from __future__ import annotations

from cuforge import _lazy

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from cuforge.compile.cache._pipeline import Compiled as Compiled
    from cuforge.compile.cache._pipeline import compile_through_cache as compile_through_cache
    from cuforge.compile.cache._pipeline import pipeline as pipeline
    from cuforge.compile.cache._pipeline import read_files as read_files
    from cuforge.compile.cache._pipeline import tracks_headers as tracks_headers

_EXPORTS = {
    "Compiled": "cuforge.compile.cache._pipeline",
    "compile_through_cache": "cuforge.compile.cache._pipeline",
    "pipeline": "cuforge.compile.cache._pipeline",
    "read_files": "cuforge.compile.cache._pipeline",
    "tracks_headers": "cuforge.compile.cache._pipeline",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = _lazy.exports(__name__, _EXPORTS)
