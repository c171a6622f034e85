"""Who may write a cache directory, and path errors people can read.

A FileStream cache serves bytes its caller loads and runs, so whoever can write to
its directories can run code as the caller. :func:`check_cache_dirs` enforces, when
a cache is opened:

- every directory of the cache -- the root, ``entries/``, ``tmp/``, ``stats/``,
  ``locks/`` and each shard under ``entries/`` -- is writable by nobody but its
  owner (and its group, when the cache was opened with a group ``mode=``), and is
  owned by the caller or by root. With a group ``mode=`` the group is trusted: the
  root may belong to another user of one of the caller's groups, and a directory
  below it to any user, if its group is the root's (setgid directories give every
  member's new directories that group);
- ``entries/``, ``tmp/``, ``stats/`` and ``locks/`` are real directories, never
  symbolic links (the root itself may be one: it is resolved once, when the cache is
  opened). A link at a shard's name under ``entries/`` is not refused: it is a
  foreign object (``filestream._anchor``), never followed -- its entries are misses,
  a store replaces the link itself with a real shard, ``cuforge cache verify`` lists
  it and ``--fix`` removes it (never its target).

``trust_shared=True`` lifts the first rule (the caller trusts everyone who can
write there, or its entries are signed -- ``open_cache`` passes it when a secret is
set); the second always holds, and so does ownership (``filestream._owned``): an
existing directory is used only if it is a cuforge cache (``CACHEDIR.TAG``, see
``storage.ownership``) or empty. Directories are checked at open; afterwards only
their owner (or a trusted group member) can change them, and the code that writes,
scans and deletes opens directories with ``O_NOFOLLOW`` besides (``_fsutil.open_dir``).

Every refusal is a :class:`CachePathError` (an ``OSError``) whose message is one
line naming the path, the problem and the fix.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat as stat_mod
from collections import namedtuple

from ._fsutil import DIR_FD, O_NOFOLLOW, make_dir, open_dir

__all__ = [
    "CachePathError",
    "DirRules",
    "UnsafeCacheError",
    "check_cache_dirs",
    "check_db_files",
    "check_root",
    "in_url_words",
    "open_root",
    "prepare_db_file",
]

_TRUST_HINT = (
    "or, if every user who can write there is trusted, pass trust_shared=True "
    "(cache URL ?trust=shared), or sign entries (CUFORGE_CACHE_SECRET / open_cache(secret=))"
)
_GROUP_HINT = "open it with mode=0o2770"
_NO_GROUP = "the cache was not opened with a group mode="
#: The way out of a ``mode=`` that lets every user write (``filestream``'s refusal).
WORLD_MODE_HINT = "use a group mode such as 0o2770, or pass trust_shared=True"

#: The ways out these messages name, as the Python API spells them, and as a cache
#: URL and the command line do (:func:`in_url_words`).
_URL_WORDS = (
    (
        _TRUST_HINT,
        "or, if every user who can write there is trusted, add ?trust=shared to the cache "
        "URL, or sign entries (CUFORGE_CACHE_SECRET, or secret_file in a settings file)",
    ),
    (_GROUP_HINT, "add ?mode=2770 to the cache URL"),
    (_NO_GROUP, "the cache URL sets no group ?mode="),
    (WORLD_MODE_HINT, "use a group mode such as ?mode=2770, or add ?trust=shared to the cache URL"),
)


def in_url_words(message: str) -> str:
    """``message`` (a :class:`CachePathError`'s, or a line quoting one) with its ways
    out in the words of a cache URL and the command line (``?trust=shared``,
    ``secret_file``, ``?mode=2770``) rather than the Python API's (``trust_shared=True``,
    ``open_cache(secret=)``, ``mode=0o2770``): what ``cuforge`` prints."""
    for api, url in _URL_WORDS:
        message = message.replace(api, url)
    if WORLD_MODE_HINT not in message and "lets every user write" in message:
        import re  # only for that message: "mode=0o777" is "?mode=777" in a URL

        message = re.sub(r"\bmode=0o([0-7]+) lets every", r"?mode=\1 lets every", message)
    return message


class CachePathError(OSError):
    """A cache path that cannot be used; ``str()`` is one line naming the path, the
    problem and what to do. ``path`` is the path, ``errno`` the OS error when one
    caused it (else None)."""

    def __init__(
        self, path: str, problem: str, err: int | None = None, kind: str = "directory"
    ) -> None:
        super().__init__(f"cache {kind} {path}: {problem}")
        self.path = path
        self.problem = problem
        self.errno = err

    @staticmethod
    def in_url_words(message: str) -> str:
        """``message`` (such an error's, or a line quoting one) with the ways out in a
        cache URL's and the command line's words: :func:`in_url_words`."""
        return in_url_words(message)


class UnsafeCacheError(CachePathError):
    """A cache directory that others could plant entries in (see the module doc)."""


class DirRules(namedtuple("DirRules", ["uid", "gids", "group", "trust_shared"])):
    """Who may own and write the cache's directories (see the module docstring):
    the caller's uid and gids, whether a group ``mode=`` was given (the group may
    write), and whether the caller trusts everyone who can write there."""

    __slots__ = ()
    uid: int
    gids: frozenset[int]
    group: bool
    trust_shared: bool

    @classmethod
    def for_process(cls, group: bool, trust_shared: bool) -> DirRules:
        if not hasattr(os, "geteuid"):  # pragma: no cover - Windows: ACLs, not modes
            return cls(-1, frozenset(), group, True)
        gids = frozenset((*os.getgroups(), os.getegid()))
        return cls(os.geteuid(), gids, group, bool(trust_shared))


def _problem(st: os.stat_result, rules: DirRules, cache_gid: int | None) -> str | None:
    """What makes a directory with stat ``st`` unsafe, or None. ``cache_gid`` is the
    root's group for directories below it (None for the root itself)."""
    if rules.trust_shared:
        return None
    mode = stat_mod.S_IMODE(st.st_mode)
    shown = f"mode {mode:04o}"
    if mode & 0o002:
        return (
            f"is writable by every user ({shown}): anyone could plant programs this "
            f"process runs; fix: chmod o-w (or chmod 700) the directory, {_TRUST_HINT}"
        )
    # With a group mode the group is trusted: for the root, a group of the caller's
    # (or one its owner chose); below it, the root's group.
    if not rules.group:
        ours = False
    elif cache_gid is None:
        ours = st.st_gid in rules.gids or st.st_uid == rules.uid
    else:
        ours = st.st_gid == cache_gid
    if mode & 0o020 and not ours:
        why = (
            f"but {_NO_GROUP}"
            if not rules.group
            else f"and its group {st.st_gid} is "
            + ("none of yours" if cache_gid is None else f"not the cache root's ({cache_gid})")
        )
        return (
            f"is writable by its group ({shown}) {why}; fix: {_GROUP_HINT} to "
            f"share it with your group, or chmod g-w the directory, {_TRUST_HINT}"
        )
    if st.st_uid not in (rules.uid, 0) and not ours:
        return (
            f"is owned by uid {st.st_uid}, not by you (uid {rules.uid}) or root: its owner "
            f"could plant programs this process runs; fix: use a cache directory of your "
            f"own (or chown it), {_TRUST_HINT}"
        )
    return None


def _oserror(path: str, exc: OSError, doing: str) -> CachePathError:
    text = exc.strerror or str(exc)
    if isinstance(exc, NotADirectoryError):
        text = "a parent of it is a file, not a directory"
    return CachePathError(
        path, f"cannot be {doing}: {text}; fix: name a directory you can create and write",
        exc.errno,
    )  # fmt: skip


def open_root(path: str, dir_mode: int | None, create: bool = True) -> os.stat_result:
    """Create the root (and parents, with ``dir_mode``) if needed and ``create``;
    return its stat.

    The root may be a symbolic link to a directory. Raises CachePathError.
    """
    try:
        if create:
            make_dir(path, dir_mode)
    except FileExistsError:
        pass  # a file in the way: reported below
    except OSError as exc:
        raise _oserror(path, exc, "created") from None
    try:
        st = os.stat(path)
    except OSError as exc:
        raise _oserror(path, exc, "opened") from None
    if not stat_mod.S_ISDIR(st.st_mode):
        raise CachePathError(path, _not_a_directory(path), errno.ENOTDIR)
    return st


#: The first 16 bytes of every SQLite database file.
_SQLITE_HEADER = b"SQLite format 3\x00"


def _not_a_directory(path: str) -> str:
    """Why the file ``path`` is no cache directory, and the fix: an SQLite database
    (its header says so) is one for ``sqlite://``; otherwise name a directory. The
    same words whether or not opening would create a missing one (a read-only handle
    creates nothing, so "or a path to create" is not said: ``cuforge doctor`` opens
    read-only and lists the line ``compile`` would fail with)."""
    head = b""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO never blocks this
        try:
            if stat_mod.S_ISREG(os.fstat(fd).st_mode):
                head = os.read(fd, len(_SQLITE_HEADER))
        finally:
            os.close(fd)
    if head == _SQLITE_HEADER:
        return (
            "is an SQLite database file, not a directory; fix: open it as "
            f"sqlite://{os.path.abspath(path)}"
        )
    return "exists and is not a directory; fix: name a directory"


def _check_below(path: str, rules: DirRules, cache_gid: int) -> bool:
    """Check one directory below the root; False when it does not exist or is not a
    directory (a file in its place cannot hold planted entries: writes that need it
    fail and warn, scans ignore it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise _oserror(path, exc, "checked") from None
    if stat_mod.S_ISLNK(st.st_mode):
        # Named as a part of the cache (the root is what the user chose), not as a
        # cache directory of its own.
        root, name = os.path.split(path)
        refused = UnsafeCacheError(
            root,
            f"its {name}/ is a symbolic link: cuforge never follows links inside a cache "
            f"(only the root may be one); fix: replace {path} with a real directory",
            errno.ELOOP,
        )
        refused.path = path
        raise refused
    if not stat_mod.S_ISDIR(st.st_mode):
        return False
    problem = _problem(st, rules, cache_gid)
    if problem is not None:
        raise UnsafeCacheError(path, problem, errno.EPERM)
    return True


def check_root(root: str, root_st: os.stat_result, rules: DirRules) -> None:
    """The module's rules for the root alone (before anything is written into it).

    Raises UnsafeCacheError."""
    problem = _problem(root_st, rules, None)
    if problem is not None:
        raise UnsafeCacheError(root, problem, errno.EPERM)


def check_cache_dirs(
    root: str, root_st: os.stat_result, subdirs: tuple[str, ...], entries: str, rules: DirRules
) -> None:
    """Apply the module's rules to ``root``, ``subdirs`` and every shard under ``entries``.

    Raises UnsafeCacheError (or CachePathError) naming the first directory refused.
    """
    check_root(root, root_st, rules)
    for sub in subdirs:
        _check_below(sub, rules, root_st.st_gid)
    # Shards: up to 256 directories, checked from one listing (lstat relative to the
    # directory); only a shard that is not plainly fine takes the full check.
    trusted = (rules.uid, 0)
    unsafe = 0o002 if rules.group else 0o022
    suspects = []
    try:
        fd = open_dir(entries) if DIR_FD else -1
    except OSError:
        return  # absent or unreadable: nothing below to plant into
    try:
        with os.scandir(fd if fd >= 0 else entries) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat_mod.S_ISLNK(st.st_mode):
                    continue  # a foreign object, never followed (module docstring)
                plain = stat_mod.S_ISDIR(st.st_mode) and st.st_uid in trusted
                if plain and (rules.trust_shared or not st.st_mode & unsafe):
                    continue
                suspects.append(e.name)
    except OSError:
        return
    finally:
        if fd >= 0:
            os.close(fd)
    for name in suspects:
        _check_below(os.path.join(entries, name), rules, root_st.st_gid)


def check_db_files(db: str, trust_shared: bool) -> None:
    """The rules for a SQLite cache: whoever could write its database, WAL, WAL index
    or lock file could plant programs. Each of ``db``, ``db-wal``, ``db-shm`` and
    ``db.lock`` that exists must be a regular file (the companions never links) owned
    by the caller or root and writable by nobody else; the directory holding them must
    not let others create files there unless it is sticky (``/tmp``: others cannot
    replace our files, and one they create first is refused here by its owner).
    ``trust_shared`` lifts the owner and mode rules, not the one on links.
    """
    rules = DirRules.for_process(False, trust_shared)
    directory = os.path.dirname(db) or "."
    try:
        dst = os.stat(directory)
    except OSError as exc:
        raise _oserror(directory, exc, "opened") from None
    mode = stat_mod.S_IMODE(dst.st_mode)
    if not rules.trust_shared and mode & 0o022 and not mode & stat_mod.S_ISVTX:
        who = "every user" if mode & 0o002 else "its group"
        raise UnsafeCacheError(
            directory,
            f"holds the SQLite cache {os.path.basename(db)} and is writable by {who} "
            f"(mode {mode:04o}, not sticky): anyone could replace the database or plant a "
            f"WAL; fix: keep the database in a directory only you can write, {_TRUST_HINT}",
            errno.EPERM,
        )
    for path in (db, db + "-wal", db + "-shm", db + ".lock"):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise _oserror(path, exc, "checked") from None
        if stat_mod.S_ISLNK(st.st_mode) and path != db:
            raise UnsafeCacheError(
                path, "is a symbolic link: SQLite would write through it; fix: remove it",
                errno.ELOOP, kind="file",
            )  # fmt: skip
        if path == db and stat_mod.S_ISLNK(st.st_mode):
            st = os.stat(path)  # the database itself may be a link, like a cache root
        if not stat_mod.S_ISREG(st.st_mode):
            raise CachePathError(path, "is not a regular file", errno.EINVAL, kind="file")
        if rules.trust_shared:
            continue
        fmode = stat_mod.S_IMODE(st.st_mode)
        if fmode & 0o022:
            who = "every user" if fmode & 0o002 else "its group"
            raise UnsafeCacheError(
                path,
                f"is writable by {who} (mode {fmode:04o}): they could plant programs this "
                f"process runs; fix: chmod 600 it, {_TRUST_HINT}",
                errno.EPERM, kind="file",
            )  # fmt: skip
        if st.st_uid not in (rules.uid, 0):
            raise UnsafeCacheError(
                path,
                f"is owned by uid {st.st_uid}, not by you (uid {rules.uid}) or root: its owner "
                f"could plant programs this process runs; fix: use a database of your own, "
                f"{_TRUST_HINT}",
                errno.EPERM, kind="file",
            )  # fmt: skip


def prepare_db_file(db: str, trust_shared: bool) -> None:
    """Make ``db``'s directory (private, like a cache root), apply
    :func:`check_db_files`, and create the database empty with mode 0600 when absent
    (SQLite gives its -wal and -shm files the database's mode). CachePathError for a
    directory that cannot be made; a file that cannot be created is left to SQLite."""
    directory = os.path.dirname(db) or "."
    try:
        make_dir(directory, None)
    except OSError as exc:
        raise _oserror(directory, exc, "created") from None
    check_db_files(db, trust_shared)
    # Exists (checked above), or a read-only directory: SQLite then says what it can.
    with contextlib.suppress(OSError):
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, 0o600))
