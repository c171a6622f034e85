"""A level of a chosen cache that does not exist yet (``Selection.missing``), and whether
it could be created: what a read-only command says instead of creating it, and what
``doctor`` and ``compile`` check before they would."""

from __future__ import annotations

import os

__all__ = ["Absent"]


class Absent:
    """A level of a chosen cache that does not exist yet: ``scheme`` (``file`` or
    ``sqlite``) and ``location`` (its directory, or database file)."""

    __slots__ = ("location", "scheme")

    def __init__(self, scheme: str, location: str) -> None:
        self.scheme, self.location = scheme, location

    def check_creatable(self) -> None:
        """Raise the CachePathError opening would raise creating this level's
        directory (a database's: the one holding it), if creating it would fail.

        Only trying tells -- ``/proc``, a read-only mount, root's rights -- so an
        empty directory of a unique name is made in the nearest existing parent and
        removed at once (through ``ownership.delete_owned``: it is provably the
        probe's, made a moment before by an exclusive ``mkdir``). Nothing is left."""
        import errno

        from ._safedir import CachePathError, _oserror
        from .ownership import delete_owned

        path = os.path.abspath(self.location)
        if self.scheme != "file":
            path = os.path.dirname(path)
        parent = path
        while not os.path.lexists(parent) and os.path.dirname(parent) != parent:
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):  # as opening says it: making it "exists", then stat
            raise _oserror(path, NotADirectoryError(errno.ENOTDIR, "not a directory"), "opened")
        probe = os.path.join(parent, f".cuforge-probe-{os.getpid()}-{os.urandom(6).hex()}")
        try:
            os.mkdir(probe, 0o700)
        except OSError as exc:
            raise _oserror(path, exc, "created") from None

        def remove(made: list[str]) -> int:
            for name in made:
                os.rmdir(name)  # empty: nobody else knows its name
            return len(made)

        if delete_owned([probe], lambda name: name == probe, remove, "probe").removed != 1:
            raise CachePathError(probe, "the probe directory could not be removed")

    def __repr__(self) -> str:
        return f"Absent({self.scheme!r}, {self.location!r})"
