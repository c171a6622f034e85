"""What a FileStream cache may create and delete: its root's proof and its layout's names.

Guarantee: a cache creates and deletes files only in a root proven its own, and
deletes only objects whose names are names of its layout; everything else in the
directory -- a user's ``entries/notes.txt``, ``tmp/build.log``, ``stats/x.cnt`` -- is
never deleted, counted or listed (``storage.ownership`` states the rule for every
backend).

The root's proof is taken once, when a handle opens (:func:`claim_root`): a root
carrying cuforge's ``CACHEDIR.TAG`` is the cache's; a missing or empty directory
becomes one (it is tagged); an untagged root an older cuforge made
(``ownership.legacy_root``: its size ledger) is tagged and kept; any other existing
directory is refused (:class:`~cuforge.storage.CachePathError`), writable or read-only,
whatever ``trust_shared`` says. The handle keeps the result (``owned``): a writable
handle is always owned (an empty root it cannot tag is refused; an older cuforge's
on a read-only file system is proven by its ledger), a read-only one only when tagged.

Every deletion goes through ``ownership.delete_owned`` with that kept proof and a
name proof (:func:`unlink_owned`, :func:`remove_foreign_owned`, or a batch):

- ``entries/<2 hex>/<62 hex>`` and its ``.cfsum`` sidecar (shards: ``<2 hex>``);
- ``tmp/``: what writers make there, each named after its writer ``<pid>-<8 hex>``:
  ``<writer>.<n>.tmp`` and ``<writer>-<n>.tmp`` (temps; the second is the older and
  the path-only form), ``<writer>.alive`` and ``<writer>.alive.new``,
  ``stats-<host>-<writer>.cnt`` and ``baseline-<writer>``;
- ``locks/<64 hex>.lock``; ``stats/<host>-<writer>.cnt``; ``size.ledger`` and
  ``size.ledger.users``.

Files a call created itself a moment earlier with ``O_EXCL`` (a temp it could not
publish) are removed by that call directly: they are its own by construction.

Failure modes: a root that cannot be listed or read is "not proven" (refused, or not
owned); a refused candidate stays where it is and is logged at DEBUG.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat as stat_mod

from .._fsutil import Fingerprint, make_dir, unlink_if_unchanged
from .._integrity import SIDECAR_SUFFIX
from .._safedir import CachePathError, DirRules, check_cache_dirs, check_root, open_root
from ..ownership import TAG_NAME, delete_owned, is_tagged, legacy_root, tag_root
from ._anchor import remove_foreign

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "AGED",
    "DEAD_OR_ALIVE",
    "EMPTY",
    "FOREIGN",
    "LEDGER_NAMES",
    "LEGACY",
    "MISSING",
    "TAGGED",
    "WRITER_ALIVE",
    "claim_root",
    "entry_file_at",
    "is_entry_file",
    "is_entry_path",
    "is_lock_file",
    "is_shard",
    "is_stats_record",
    "open_owned_root",
    "remake_dir",
    "remove_foreign_owned",
    "root_state",
    "temp_kind",
    "unlink_owned",
]

_HEX = frozenset("0123456789abcdef")
LEDGER_NAMES = frozenset({"size.ledger", "size.ledger.users"})

# Root states (root_state).
MISSING = "missing"
EMPTY = "empty"
TAGGED = "tagged"
LEGACY = "legacy"
FOREIGN = "foreign"

# Temp kinds (temp_kind): a temp that goes when its writer is dead, a writer's liveness
# file, a writer-made file that goes once stale; 0 for a name writers never make.
DEAD_OR_ALIVE = 1
WRITER_ALIVE = 2
AGED = 3


def _hex(text: str, n: int) -> bool:
    return len(text) == n and _HEX.issuperset(text)


def is_shard(name: str) -> bool:
    """``<2 hex>``: a shard directory under ``entries/``."""
    return _hex(name, 2)


def is_entry_file(name: str) -> bool:
    """``<62 hex>`` or ``<62 hex>.cfsum``: a payload or its sidecar, inside a shard."""
    if name.endswith(SIDECAR_SUFFIX):
        name = name[: -len(SIDECAR_SUFFIX)]
    return _hex(name, 62)


def entry_file_at(path: str) -> bool:
    """Whether the last component of ``path`` is an entry file's name."""
    return is_entry_file(os.path.basename(path))


def is_entry_path(path: str) -> bool:
    """A path ending in ``<2 hex>/<62 hex>[.cfsum]``."""
    shard, name = os.path.split(path)
    return is_entry_file(name) and is_shard(os.path.basename(shard))


def is_lock_file(name: str) -> bool:
    """``<64 hex>.lock`` under ``locks/``."""
    return name.endswith(".lock") and _hex(name[:-5], 64)


def _is_writer(text: str) -> bool:
    """``<pid>-<8 hex>``: one writer (one handle in one process)."""
    pid, dash, tag = text.partition("-")
    return bool(dash) and pid.isdigit() and pid.isascii() and _hex(tag, 8)


def _is_record(text: str) -> bool:
    """``<host>-<pid>-<8 hex>.cnt``: a handle's counter record."""
    if not text.endswith(".cnt"):
        return False
    rest, dash, tag = text[:-4].rpartition("-")
    _host, dash2, pid = rest.rpartition("-")  # the host name may hold dashes, or be empty
    return bool(dash and dash2) and _is_writer(f"{pid}-{tag}")


def is_stats_record(name: str) -> bool:
    """A counter record under ``stats/`` (``merged`` and ``baseline`` are never deleted)."""
    return _is_record(name)


def temp_kind(name: str) -> int:
    """What ``name`` in ``tmp/`` is: :data:`DEAD_OR_ALIVE` (``<writer>.<n>.tmp``: goes
    when its writer is dead), :data:`WRITER_ALIVE` (``<writer>.alive``), :data:`AGED`
    (another name writers make: goes once stale), or 0 (not the cache's)."""
    parts = name.split(".")
    if len(parts) == 3 and parts[2] == "tmp" and parts[1].isdigit() and _is_writer(parts[0]):
        return DEAD_OR_ALIVE
    if len(parts) == 2 and parts[1] == "alive" and _is_writer(parts[0]):
        return WRITER_ALIVE
    if len(parts) == 3 and parts[1:] == ["alive", "new"] and _is_writer(parts[0]):
        return AGED
    if name.endswith(".tmp"):  # <writer>-<n>.tmp
        writer, _, n = name[:-4].rpartition("-")
        return AGED if n.isdigit() and _is_writer(writer) else 0
    if name.startswith("stats-"):
        return AGED if _is_record(name[6:]) else 0
    if name.startswith("baseline-"):
        return AGED if _is_writer(name[9:]) else 0
    return 0


def writer_of(name: str) -> str:
    """The writer a ``DEAD_OR_ALIVE`` or ``WRITER_ALIVE`` name belongs to."""
    return name.split(".", 1)[0]


# -- the root ---------------------------------------------------------------------------
def _only_tag_temps(path: str) -> bool:
    """Whether ``path`` holds nothing but (maybe) tag temps another opener is linking
    into place (``ownership.tag_root``: a temp, then the tag, then no temp)."""
    with os.scandir(path) as it:
        for e in it:
            if not (e.name.startswith(f".{TAG_NAME}.") and e.name.endswith(".tmp")):
                return False
    return True


def root_state(path: str) -> str:
    """:data:`MISSING`, :data:`TAGGED`, :data:`EMPTY`, :data:`LEGACY` or :data:`FOREIGN`
    (an existing directory that is none of these, or cannot be listed). Looks only."""
    if not os.path.lexists(path):
        return MISSING
    try:
        # Listed before the tag is read: a concurrent opener tags a root before it
        # puts anything else there, so "not empty" is seen only after its tag is.
        empty = _only_tag_temps(path)
    except OSError:
        return FOREIGN
    if is_tagged(path):
        return TAGGED
    if empty:
        return EMPTY
    return LEGACY if legacy_root(path) else FOREIGN


#: The default cache's name in cuforge's own directory (``default_cache_dir``), which
#: also holds the command line's state (``identity/``, ``cli-hits/``): not a cache.
DEFAULT_NAME = "program-cache"


def not_a_cache(path: str, read_only: bool) -> CachePathError:
    """The refusal of an existing directory that is not a cuforge cache; one holding
    a cuforge cache as :data:`DEFAULT_NAME` (cuforge's own directory) is told to name
    that cache."""
    inner = os.path.join(path, DEFAULT_NAME)
    if root_state(inner) in (TAGGED, LEGACY):
        where = f"name the cuforge cache inside it, {inner}"
    else:
        where = "name the directory of a cuforge cache" if read_only else (
            "name an empty or new directory for the cache"
        )  # fmt: skip
    if read_only:
        fix = f"fix: {where} (nothing was read or changed)"
    else:
        fix = f"cuforge creates and deletes files only in its own caches; fix: {where}"
    return CachePathError(
        path, f"is not a cuforge cache (no CACHEDIR.TAG) and is not empty; {fix}",
        errno.ENOTEMPTY,
    )  # fmt: skip


def claim_root(root: str, read_only: bool, file_mode: int | None) -> bool:
    """Prove ``root`` (an existing directory) the cache's; whether it is owned.

    Tags a root that is empty or an older cuforge's, unless ``read_only`` (then
    nothing is written and the answer is whether it is tagged). Raises
    CachePathError for any other directory (see the module docstring), and for an
    empty one that cannot be tagged (a writable handle is always owned)."""
    state = root_state(root)
    if state == FOREIGN:
        raise not_a_cache(root, read_only)
    if state == TAGGED or read_only:
        return state == TAGGED
    try:
        tag_root(root, file_mode)
    except OSError as exc:
        if state == LEGACY:  # proven by its ledger; a later opener that can write tags it
            return True
        raise CachePathError(
            root, f"cannot be marked as a cuforge cache ({exc.strerror or exc}); fix: name "
            "a directory you can write", exc.errno,
        ) from None  # fmt: skip
    return True


#: The directories below the root, ``entries/`` first.
SUBDIRS = ("entries", "tmp", "stats", "locks")


def open_owned_root(
    given: str, dir_mode: int | None, file_mode: int | None, rules: DirRules, read_only: bool
) -> tuple[str, bool]:
    """Open the root ``given`` (creating it unless ``read_only``), apply ``_safedir``'s
    rules to it before anything is written there, prove it the cache's
    (:func:`claim_root`), make its directories (unless ``read_only``) and check them;
    ``(the resolved root, owned)``. A read-only handle on a path that does not exist
    sees an empty cache: nothing is checked or made. Raises CachePathError."""
    absent = read_only and not os.path.lexists(given)
    root_st = None if absent else open_root(given, dir_mode, create=not read_only)
    root = os.path.realpath(given)
    if root_st is None:
        return root, False
    check_root(given, root_st, rules)
    owned = claim_root(root, read_only, file_mode)
    subdirs = tuple(os.path.join(root, d) for d in SUBDIRS)
    if not read_only:
        for sub in subdirs:
            with contextlib.suppress(OSError):  # read-only caches still serve hits
                make_dir(sub, dir_mode)
    check_cache_dirs(given, root_st, subdirs, subdirs[0], rules)
    return root, owned


def remake_dir(path: str, root: str, dir_mode: int | None, file_mode: int | None) -> None:
    """``make_dir(path)`` for a directory of the cache that is gone; when the root went
    with it (a user removed the whole cache under a live handle), the new root is
    tagged, so the next opener accepts the cache this handle keeps using."""
    had_root = os.path.isdir(root)
    make_dir(path, dir_mode)
    if not had_root:
        with contextlib.suppress(OSError):
            tag_root(root, file_mode)


# -- deletions --------------------------------------------------------------------------
def unlink_owned(
    owned: bool,
    name: str,
    expected: Fingerprint,
    dir_fd: int | None,
    proves: Callable[[str], bool],
    where: str,
) -> bool:
    """Delete the regular file ``name`` (relative to ``dir_fd``) if the root is owned,
    ``proves(name)`` holds, and it is still the file ``expected`` describes."""
    done = delete_owned(
        (name,),
        lambda n: owned and proves(n),
        lambda own: sum(unlink_if_unchanged(n, expected, dir_fd) for n in own),
        where,
    )
    return done.removed > 0


def remove_foreign_owned(
    owned: bool,
    name: str,
    dir_fd: int | None,
    proves: Callable[[str], bool],
    where: str,
    expect_ino: int | None = None,
    *,
    files_too: bool = False,
) -> bool:
    """``_anchor.remove_foreign`` of ``name`` if the root is owned and ``proves(name)``
    holds (a FIFO, link or directory standing at a name of the layout)."""
    done = delete_owned(
        (name,),
        lambda n: owned and proves(n),
        lambda own: sum(remove_foreign(n, dir_fd, expect_ino, files_too=files_too) for n in own),
        where,
    )
    return done.removed > 0


def unlink_special(
    owned: bool, path: str, proves: Callable[[str], bool], where: str, ino: int | None = None
) -> bool:
    """Unlink the non-regular object (a FIFO, a device) at ``path`` where a file of the
    cache belongs -- with ``ino``, only if it is still that inode -- if the root is
    owned and ``proves(basename)`` holds; a regular file there is kept."""

    def remove(own: list[str]) -> int:
        gone = 0
        for p in own:
            with contextlib.suppress(OSError):
                st = os.lstat(p)
                if not stat_mod.S_ISREG(st.st_mode) and ino in (None, st.st_ino):
                    os.unlink(p)
                    gone += 1
        return gone

    done = delete_owned((path,), lambda p: owned and proves(os.path.basename(p)), remove, where)
    return done.removed > 0
