"""``file:///path/to/dir?max_size=..&mode=2770&durable&trust=shared&ro`` (or a plain
path): the URL scheme of :class:`cuforge.storage.filestream.FileStreamProgramCache`
(``ro``: a read-only handle, which creates and deletes nothing).

Named in ``storage.urls``' scheme table and imported only when such a URL is opened.
"""

from __future__ import annotations

from ..spec import CacheSpec
from . import FileStreamProgramCache

__all__ = ["check_file", "open_file"]


def check_file(spec: CacheSpec) -> int | None:
    """What :func:`open_file` refuses in the URL itself, checked without opening
    (``storage.urls.check_level``): ValueError naming the bad part. The ``mode``."""
    if not spec.location:
        raise spec.error("file:// needs a directory (file:///path/to/cache)")
    mode = spec.params.get("mode")
    try:
        mode_value = None if mode is None else int(mode, 8)
    except ValueError:
        raise spec.error(f"mode={mode!r} is not an octal permission (e.g. 2770)") from None
    # each raises for a value that does not parse
    spec.size("max_size")
    spec.flag("durable")
    spec.trust_shared()
    return mode_value


def open_file(spec: CacheSpec) -> FileStreamProgramCache:
    """The FileStreamProgramCache ``spec`` names; ValueError naming the bad part."""
    mode_value = check_file(spec)
    return FileStreamProgramCache(
        spec.location,
        max_size_bytes=spec.size("max_size"),
        mode=mode_value,
        durable=spec.flag("durable"),
        trust_shared=spec.trust_shared(),
        read_only=spec.read_only,
    )
