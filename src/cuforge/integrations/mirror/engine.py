"""The directory mirror: one JIT's directory hydrated from a cuforge cache before it
runs, and the files it completed published back (see the package docstring).

Entries: each file is one foreign entry (kind ``mirror``) named
``profile:version:platform:gpu:relative/path``, whose record holds the file's
sha256 and size -- except the files of a profile's ``bundle``, whose group is one
entry named ``...:folder/key/`` (``_bundles``); an index entry (kind
``mirror-index``, named by the same prefix) lists every published path (and bundle)
with its sha256 and size. Hydration reads the index, fetches what the directory
lacks in batches, and writes a file only when its bytes verify (the cache's
integrity and signature, the record's and the index's sha256), a bundle's files all
or none.

The mirror's own memory of the directory is a state file in it
(``.cuforge-mirror-<profile>.json``): each file it wrote or published, with the
version (size, mtime, ctime, inode) it saw and its sha256. It decides three things:
a file the mirror wrote and nobody changed since may be replaced by a newer cached
version (any other local file never is); a file whose version is the one recorded
is not read again; and a file changed in place after it was recorded (same inode,
another version: the JITs profiled here replace files by rename, never rewrite
them) is tampered with and never published.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import threading
import time
import warnings
from collections.abc import Mapping

from cuforge._stack import outside_level
from cuforge.storage.base import CacheReadWarning, CacheWriteWarning, ProgramCacheResource
from cuforge.storage.record import decode_record

from .._cache import ForeignEntries, select_cache
from . import _bundles, _files
from ._host import gpu_identity, host_identity, platform_tag
from .profiles import Profile
from .results import HydrateResult, PublishResult

TYPE_CHECKING = False  # typing is not imported at run time: a runner starts faster
if TYPE_CHECKING:
    from typing import Any

    from ._bundles import Unit

__all__ = ["ENV_CACHE", "HydrateResult", "Mirror", "PublishResult"]

#: The cache the mirror uses when none is given: a URL or ``off``; else what
#: ``cache=True`` uses (docs/cache.md, "Which cache").
ENV_CACHE = "CUFORGE_MIRROR_CACHE"
FILE_KIND = "mirror"
INDEX_KIND = "mirror-index"
_INDEX_LIMIT = 64 << 20
_BATCH = 128
_LOCK_TIMEOUT = 10.0


def _q(part: str) -> str:
    """A name component without ``:`` (``%``-escaped), so names split unambiguously."""
    return part.replace("%", "%25").replace(":", "%3A")


class Mirror:
    """``profile``'s directory on ``cache`` (a cache, a URL, or None:
    ``$CUFORGE_MIRROR_CACHE``, else cuforge's default cache).

    ``directory``: the JIT's directory (default: the profile's, from ``env``).
    ``gpu``: the GPU identity a GPU-dependent profile's keys name (default:
    :func:`~cuforge.integrations.mirror.gpu_identity`; compute it once per job).
    ``version``: the JIT's version (default: the profile's). ``host``: for a
    host-dependent profile, the identity its keys name (default:
    :func:`~cuforge.integrations.mirror.host_identity` with ``$CXX`` of ``env``). A
    mirror missing any of these is inactive (``reason`` says why): hydrate and publish
    do nothing. Only a ``cache`` argument the parser refuses raises (ValueError), as
    everywhere.
    ``settle_s``: how far apart the two looks are that tell a completed file.
    """

    def __init__(
        self,
        profile: Profile,
        cache: ProgramCacheResource | str | None = None,
        directory: str | os.PathLike[str] | None = None,
        *,
        gpu: str | None = None,
        version: str | None = None,
        host: str | None = None,
        settle_s: float = 1.0,
        max_file_bytes: int = 512 << 20,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.profile = profile
        self.settle_s = settle_s
        self.max_file_bytes = max_file_bytes
        self.version = version or profile.version()
        if gpu is None and profile.gpu_dependent:
            gpu = gpu_identity()
        self.gpu = gpu if profile.gpu_dependent else None
        if host is None and profile.host_dependent:
            host = host_identity((env if env is not None else os.environ).get("CXX"))
        self.host = host if profile.host_dependent else None
        if directory is not None:
            self.directory: str | None = os.path.abspath(os.fspath(directory))
        else:
            self.directory = profile.directory(env, self.version)
        resolved = select_cache(cache, ENV_CACHE)
        self.cache = resolved
        self.reason = (
            "no cache" if resolved is None
            else f"{profile.name} is not installed (no version)" if not self.version
            else "the GPU cannot be identified" if profile.gpu_dependent and not self.gpu
            else "the host cannot be identified" if profile.host_dependent and not self.host
            else f"no directory (${unset} in its path is not set)"
            if self.directory is None and (unset := profile.unset_variable(env))
            else f"no directory (set ${(profile.env or ('its variable',))[0]})"
            if self.directory is None
            else ""
        )  # fmt: skip
        where = platform_tag() if self.host is None else f"{platform_tag()}+{self.host}"
        self.prefix = ":".join(
            _q(p) for p in (profile.name, self.version or "", where, self.gpu or "any")
        )
        self._entries = None if resolved is None else ForeignEntries(resolved, FILE_KIND)
        self._index = None if resolved is None else ForeignEntries(resolved, INDEX_KIND)
        self._state_name = f"{_files.TEMP_PREFIX}{profile.name}.json"
        self._seen: dict[str, Unit] = {}  # the previous look at each file or bundle
        self._started_ns = time.time_ns()  # a new_only profile publishes what is newer
        self._busy = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return not self.reason

    # -- hydrate ---------------------------------------------------------------------
    def hydrate(self) -> HydrateResult:
        """Write into the directory every cached file it lacks (verified, atomically,
        never over a local file the mirror did not write). Never raises: a cache or
        file-system fault is a :class:`CacheReadWarning` and a result with ``reason``."""
        if not self.active:
            return HydrateResult(active=False, reason=self.reason)
        with self._busy:
            out = HydrateResult()
            try:
                self._hydrate(out)
            except Exception as exc:  # fail-open: the job runs as without the mirror
                out.reason = f"{type(exc).__name__}: {exc}"
                _warn(CacheReadWarning, self.profile.name, f"hydrate failed ({out.reason})")
            return out

    def _hydrate(self, out: HydrateResult) -> None:
        assert self.directory is not None and self._entries is not None
        index = self._load_index()
        if not index:
            return
        owner = _files.foreign_owner(self.directory)
        if owner is not None:
            out.reason = (
                f"{self.directory} belongs to another user (uid {owner}): nothing is hydrated "
                "(give this job a directory of its own)"
            )
            _warn(CacheReadWarning, self.profile.name, out.reason)
            return
        root = _files.open_root(self.directory, create=True)
        try:
            if _files.foreign_owner(root) is not None:  # replaced since it was looked at
                out.reason = f"{self.directory} belongs to another user: nothing is hydrated"
                _warn(CacheReadWarning, self.profile.name, out.reason)
                return
            state = self._load_state(root)
            todo: list[tuple[str, str, int, _files.Sig | None]] = []
            present: list[str] = []  # listed, and the directory has those very bytes
            for rel, (sha, size) in sorted(index.items()):
                if rel.endswith("/") and _bundles.listed(self.profile, rel):
                    held = _bundles.held(root, rel, sha, self.profile, state)
                    out.present += held
                    if held:
                        present.append(rel)
                    else:  # fetched, checked and written whole: _fetch
                        todo.append((rel, sha, size, None))
                    continue
                if (
                    _files.safe_relpath(rel) is None
                    or self.profile.skipped(rel)
                    or not self.profile.included(rel)
                    or self.profile.bundle_of(rel.rpartition("/")[2]) is not None
                ):  # a bundle's file listed alone (an older cuforge's) may be two hosts'
                    out.refused += 1
                    continue
                try:
                    st = _files.lstat_at(root, rel)
                except OSError:  # a link or a file where a directory should be
                    out.skipped_other += 1
                    continue
                if st is None:
                    todo.append((rel, sha, size, None))
                    continue
                if not stat.S_ISREG(st.st_mode):
                    out.skipped_other += 1
                    continue
                sig = _files.sig_of(st)
                mine = state.get(rel)
                if mine is not None and tuple(mine[:4]) == sig and mine[4] == sha:
                    out.present += 1
                    present.append(rel)
                elif st.st_size == size and self._local_sha(root, rel, sig) == sha:
                    out.present += 1
                    present.append(rel)
                    state[rel] = [*sig, sha, 0]
                elif mine is not None and tuple(mine[:4]) == sig and mine[5]:
                    todo.append((rel, sha, size, sig))  # the mirror's own older copy
                else:
                    out.skipped_newer += 1
            for start in range(0, len(todo), _BATCH):
                self._fetch(root, todo[start : start + _BATCH], state, out)
            self._note(present)
            if out.written or out.present:
                self._save_state(root, state)
        finally:
            os.close(root)

    def _local_sha(self, root: int, rel: str, sig: _files.Sig) -> str | None:
        got = _files.read_whole(root, rel, self.max_file_bytes)
        if got is None or got[1] != sig:
            return None
        return hashlib.sha256(got[0]).hexdigest()

    def _fetch(
        self,
        root: int,
        batch: list[tuple[str, str, int, _files.Sig | None]],
        state: dict[str, list[Any]],
        out: HydrateResult,
    ) -> None:
        assert self._entries is not None
        cache = self._entries.cache
        names = [f"{self.prefix}:{rel}" for rel, *_ in batch]
        try:
            found = cache.get_entries([self._entries.key(n) for n in names])
        except Exception as exc:  # a cache fault: these files are misses
            _warn(
                CacheReadWarning, self.profile.name, f"lookup failed ({type(exc).__name__}: {exc})"
            )
            out.missing += len(batch)
            return
        for (rel, sha, size, own), name, entry in zip(batch, names, found, strict=True):
            if entry is None:
                out.missing += 1
                continue
            record = decode_record(entry.meta, FILE_KIND)
            data = bytes(entry.data)
            if record is None or record.get("key") != name or len(data) != size:
                out.verified_failures += 1
                continue
            if rel.endswith("/"):
                try:
                    got = _bundles.unpack(data, sha)
                    if _bundles.hydrate(root, rel, got, self.profile, state, out, self._local_sha):
                        self._note([rel])  # all there already
                except OSError:
                    out.errors += 1
                continue
            if hashlib.sha256(data).hexdigest() != sha:
                out.verified_failures += 1
                continue
            try:
                sig = self._place(root, rel, data, own)
            except OSError:
                out.errors += 1
                continue
            if sig is None:
                out.skipped_newer += 1
                continue
            out.written += 1
            out.replaced += own is not None
            state[rel] = [*sig, sha, 1]

    def _place(self, root: int, rel: str, data: bytes, own: _files.Sig | None) -> _files.Sig | None:
        """Write ``data`` at ``rel``: where nothing stands, or over the mirror's own
        older copy ``own`` (moved aside first, removed once proven the mirror's)."""
        if own is None:
            return _files.write_new(root, rel, data)
        folder, _, name = rel.rpartition("/")
        placed = _bundles.place(root, folder, [(name, data)], {name: own})
        return None if placed is None else placed[name]

    # -- publish ---------------------------------------------------------------------
    def publish(self, wait: bool = True) -> PublishResult:
        """Store every file the JIT completed that the cache lacks, and list it in the
        index. A file seen for the first time (or changed since the last look) is
        looked at again ``settle_s`` later within this call, or with ``wait=False`` at
        the next call. Never raises: a fault is a :class:`CacheWriteWarning`."""
        return self._publish(wait)

    def _publish(self, wait: bool) -> PublishResult:
        if not self.active:
            return PublishResult(active=False, reason=self.reason)
        with self._busy:
            out = PublishResult()
            try:
                self._publish_once(out, wait)
            except Exception as exc:  # fail-open
                out.reason = f"{type(exc).__name__}: {exc}"
                _warn(CacheWriteWarning, self.profile.name, f"publish failed ({out.reason})")
            return out

    def _publish_once(self, out: PublishResult, wait: bool) -> None:
        assert self.directory is not None
        try:
            root = _files.open_root(self.directory)
        except FileNotFoundError:
            return
        try:
            st = os.fstat(root)
            uid = os.geteuid() if hasattr(os, "geteuid") else None
            if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
                out.reason = f"{self.directory} is writable by every user: nothing is published"
                _warn(CacheWriteWarning, self.profile.name, out.reason)
                return
            files, out.foreign = self._scan(root, uid)
            units = _bundles.units(files, self.profile, self._started_ns)
            state = self._load_state(root)
            index = self._load_index()
            ready, fresh = self._classify(units, state, index, out)
            if fresh and wait:
                time.sleep(self.settle_s)
                again = _bundles.units(self._scan(root, uid)[0], self.profile, self._started_ns)
                for name in fresh:
                    if again.get(name) == units[name]:
                        ready.append(name)
                    else:
                        out.pending += len(units[name])
                        if name in again:
                            self._seen[name] = again[name]
            else:
                out.pending += sum(len(units[name]) for name in fresh)
            added = self._store(root, ready, units, state, index, out)
            if added:
                self._merge_index(added)
            if added or out.unchanged:
                self._save_state(root, state)
        finally:
            os.close(root)

    def _scan(self, root: int, uid: int | None) -> tuple[dict[str, _files.Sig], int]:
        """The directory's files of the kinds mirrored (not skipped, ``only``)."""
        files, foreign = _files.scan(root, self.profile.skipped, uid)
        if self.profile.only:
            files = {rel: sig for rel, sig in files.items() if self.profile.included(rel)}
        return files, foreign

    def _building(self, root: int, rel: str) -> bool:
        """Whether a marker says ``rel`` is still being built in place (``busy_while``),
        looked at before the file is read: a marker gone by then means the build that
        wrote the file had finished. A marker that cannot be looked at counts as there."""
        for marker in self.profile.markers(rel):
            try:
                if _files.lstat_at(root, marker) is not None:
                    return True
            except OSError:
                return True
        return False

    def _classify(
        self,
        units: dict[str, Unit],
        state: dict[str, list[Any]],
        index: dict[str, tuple[str, int]],
        out: PublishResult,
    ) -> tuple[list[str], list[str]]:
        """Split the directory's units (files and bundles) into ready (complete: the
        same at the previous look), fresh (first seen or changed since), and the rest
        (counted in ``out``, by files): unchanged since recorded and listed so, or
        tampered -- a bundle with one file changed in place is never published."""
        ready: list[str] = []
        fresh: list[str] = []
        for name, unit in sorted(units.items()):
            known = {rel: state.get(rel) for rel in unit}
            if all(k is not None and tuple(k[:4]) == unit[rel] for rel, k in known.items()):
                if _bundles.recorded(name, unit, known) == index.get(name, ("",))[0]:
                    out.unchanged += len(unit)
                    self._note([name])
                    continue
            elif any(
                k is not None and k[3] == unit[rel][3] and tuple(k[:4]) != unit[rel]
                for rel, k in known.items()
            ):
                out.tampered += len(unit)  # the same inode changed in place: never published
                continue
            if sum(sig[0] for sig in unit.values()) > self.max_file_bytes:
                out.too_large += len(unit)
            elif self._seen.get(name) == unit:
                ready.append(name)
            else:
                self._seen[name] = unit
                fresh.append(name)
        return ready, fresh

    def _store(
        self,
        root: int,
        ready: list[str],
        units: dict[str, Unit],
        state: dict[str, list[Any]],
        index: dict[str, tuple[str, int]],
        out: PublishResult,
    ) -> dict[str, tuple[str, int]]:
        assert self._entries is not None
        added: dict[str, tuple[str, int]] = {}
        for name in ready:
            unit = units[name]
            if self.profile.busy_while and any(self._building(root, rel) for rel in unit):
                out.pending += len(unit)  # published at a later look, once the build is done
                continue
            got = (
                _bundles.snapshot(root, name, unit, self.profile, self.max_file_bytes)
                if name.endswith("/")
                else _bundles.single(root, name, unit[name], self.max_file_bytes)
            )
            if got is None:
                out.pending += len(unit)
                continue
            data, sha, shas = got
            if index.get(name) == (sha, len(data)):
                out.unchanged += len(unit)
                self._note([name])
            else:
                fields: dict[str, str | int | None] = {
                    "name": _shown(f"{self.profile.name}:{name}"),
                    "profile": self.profile.name,
                    "version": self.version,
                    "gpu": self.gpu,
                    "path": name,
                    "sha256": sha,
                    "size": len(data),
                }
                if name.endswith("/"):
                    fields["files"] = len(unit)
                if not self._entries.store(f"{self.prefix}:{name}", data, fields):
                    out.dropped += len(unit)
                    continue
                out.stored += len(unit)
                added[name] = (sha, len(data))
            for rel, sig in unit.items():
                own = state.get(rel)
                mine = own is not None and tuple(own[:4]) == sig and own[5]
                state[rel] = [*sig, shas[rel], 1 if mine else 0]
        return added

    def _note(self, rels: list[str]) -> None:
        """Tell a recording cache (a warm set's ``Recorder``: ``cuforge run --warm-set``)
        that this job uses the entries of ``rels`` though it did not read them (their
        files were there already): a fresh host's prefetch then fetches them too.
        Entries read or stored are noted by the recorder itself."""
        assert self._entries is not None
        note = getattr(self._entries.cache, "note", None)
        if callable(note):
            for rel in rels:
                note(self._entries.key(f"{self.prefix}:{rel}"))

    # -- the index -------------------------------------------------------------------
    def _load_index(self) -> dict[str, tuple[str, int]]:
        """The published paths (sha256, size) under this mirror's prefix; empty when
        absent, damaged or unreadable (the load warns on a fault)."""
        assert self._index is not None
        raw = self._index.load(self.prefix)
        if raw is None or len(raw) > _INDEX_LIMIT:
            return {}
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            return {}
        files = body.get("files") if isinstance(body, dict) else None
        if not isinstance(files, dict):
            return {}
        out: dict[str, tuple[str, int]] = {}
        for rel, value in files.items():
            if (
                isinstance(value, list)
                and len(value) == 2
                and isinstance(value[0], str)
                and len(value[0]) == 64
                and isinstance(value[1], int)
                and value[1] >= 0
            ):
                out[rel] = (value[0], value[1])
        return out

    def _merge_index(self, added: dict[str, tuple[str, int]]) -> None:
        """Add ``added`` to the stored index under the cache's lock of the index key
        (a publisher on another host merging at once would otherwise drop one side's
        paths; without the lock, a lost path is published again at its next look)."""
        assert self._index is not None
        key = self._index.key(self.prefix)
        try:
            lock = self._index.cache.lock(key, timeout=_LOCK_TIMEOUT)
        except Exception:  # no lock: merge anyway
            lock = None
        try:
            if lock is not None:
                lock.__enter__()
            files = self._load_index()
            files.update(added)
            body = {"files": {rel: list(v) for rel, v in sorted(files.items())}}
            data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
            self._index.store(
                self.prefix, data, {"profile": self.profile.name, "files": len(files)}
            )
        finally:
            if lock is not None:
                lock.__exit__(None, None, None)

    # -- the state file --------------------------------------------------------------
    def _load_state(self, root: int) -> dict[str, list[Any]]:
        got = _files.read_whole(root, self._state_name, _INDEX_LIMIT)
        if got is None:
            return {}
        try:
            body = json.loads(got[0])
        except (ValueError, RecursionError):
            return {}
        if not isinstance(body, dict) or body.get("prefix") != self.prefix:
            return {}
        files = body.get("files")
        if not isinstance(files, dict):
            return {}
        return {
            rel: v
            for rel, v in files.items()
            if isinstance(v, list) and len(v) == 6 and all(isinstance(x, int) for x in v[:4])
        }

    def _save_state(self, root: int, state: dict[str, list[Any]]) -> None:
        data = json.dumps({"prefix": self.prefix, "files": state}, separators=(",", ":")).encode()
        tmp = f"{_files.TEMP_PREFIX}{os.getpid()}-{threading.get_ident()}.state"
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0),
            0o600,
            dir_fd=root,
        )
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self._state_name, src_dir_fd=root, dst_dir_fd=root)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=root)
            raise

    # -- periodic publishing ---------------------------------------------------------
    def start_periodic(self, interval_s: float = 30.0) -> None:
        """Publish every ``interval_s`` seconds from a daemon thread until :meth:`stop`
        (a file is published at the first look after the one that first saw it)."""
        if self._thread is not None or not self.active:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval_s):
                self._publish(wait=False)

        self._thread = threading.Thread(
            target=loop, name=f"cuforge-mirror-{self.profile.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> PublishResult:
        """Stop the periodic thread (if any) and publish once more (waiting
        ``settle_s`` for files seen for the first time). Never raises."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()
        return self.publish()


def _shown(name: str, limit: int = 80) -> str:
    """``name`` as ``cuforge cache ls`` shows it: its end (the file) when too long."""
    return name if len(name) <= limit else "..." + name[3 - limit :]


def _warn(category: type[Warning], profile: str, what: str) -> None:
    warnings.warn(
        f"cuforge mirror ({profile}): {what}; the JIT runs as without the mirror",
        category,
        stacklevel=outside_level(),
    )
