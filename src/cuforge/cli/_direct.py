"""The fast hit path of ``cuforge compile``: a repeated command served without
parsing it, without the compile layer, and without computing the cache key.

A build system runs the same command line again and again; when nothing changed,
the answer is the cache entry it got last time. After every successful ``cuforge
compile`` the full path may leave a *hit record* here, named by a digest of the
request -- the arguments, the working directory, the cuforge code and version, the
interpreter, and the environment variables the command reads (``CUFORGE_*``,
``HOME``, ``XDG_CACHE_HOME``; not ``$CUFORGE_RUN_JOURNAL``, the journals' directory
of a ``cuforge run --warm-set`` job, a new one each run, which changes what is
recorded, never what is compiled). The record holds, per output: the source path and a
digest of its content, the output path, the cache entry key the full path computed,
and, for the whole request, the file cache's directory and digests of the compiler
facts the keys were made from (``_identity_store``).

:func:`serve` answers a request only when a record for exactly this request exists,
every source still has the recorded content, every compiler fact still holds (its
witnesses unchanged, see ``_identity_store``) and equals the recorded one, and
every entry is still in the cache and verifies (the cache's own integrity check).
Anything else -- a missing or damaged record, a changed source, compiler or header
set, an evicted entry -- returns None and the full path runs, exactly as if this
module did not exist. So this path can make a hit faster, never different: in a
``cuforge run --warm-set`` job, the keys it served are journaled into the run's warm
set as the full path's lookups would be (``integrations.warmsets.recording``);
outside one, that costs one variable lookup.

Records are written only for what the key fully describes from these inputs: CUDA
C++ that reads no user header (no tracked includes: those are validated by the
manifests of the full path) compiled to cubin or LTO-IR (a PTX hit may warn about
the driver) for an arch the command names -- ``--arch``, or the ``arch`` of a
settings file, which the digest covers (``_config.fingerprint``) -- with every
output's entry read back equal to what was written, through an unsigned cache of
one of these kinds:

- a plain directory cache (the record names its directory);
- a tier whose first persistent level is one of these (``file:///…,redis://…``,
  ``memory://,redis://…``): the record names that level, which serves the hit --
  the levels behind it are never opened, as in the full path (lazy levels);
  anything it misses goes to the full path (never for a read-only level: this path
  would open it writable);
- a Redis server named by a URL without credentials (the record holds the URL; a
  password is never written to disk): the hit path's small client serves it, and
  redis-py is never imported;
- an ``s3://`` bucket (its URL never holds credentials: they come from the
  environment, read again by each run). They live in
``<state>/cli-hits/`` (``compile.toolchain.state_dir()``; off with
``CUFORGE_STATE_DIR=off``), private to the user, and are pruned to the newest half
when a shard passes 64 files.

An arch taken from device 0 is in none of the inputs above (``CUDA_VISIBLE_DEVICES``,
or another node sharing ``$HOME``, changes it), and this path never asks the driver
(``cuInit`` costs 100s of ms): the full path leaves no record for such a command, so
it always takes the full path. Give ``--arch`` to get the fast hit path.

Outputs are written by :func:`write_output`, which checks the opened file: an output
that has become one of the record's sources (a link to it put there since) is never
written; the full path then refuses the command.
"""

from __future__ import annotations

import os
import stat
import sys
import time

from cuforge._hashing import blake2b
from cuforge.compile import toolchain

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Container, Sequence
    from typing import Any

    from cuforge.storage.base import ProgramCacheResource
    from cuforge.storage.entry import CacheEntry

__all__ = ["remember", "request_digest", "serve", "write_output"]

_FORMAT = b"cuforge-direct-2"
_ENV_NAMES = ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")
#: ``CUFORGE_*`` variables outside the request: a run's journal directory (see above).
_ENV_UNNAMED = ("CUFORGE_RUN_JOURNAL",)
_SHARD_MAX = 64
_CODE_DIRS = ("compile", "cli")


def _records_dir() -> str | None:
    root = toolchain.state_dir()
    return None if root is None else os.path.join(root, "cli-hits")


def request_digest(argv: Sequence[str]) -> str:
    """Names everything that gives the same command line the same meaning. Computed
    once per process, before the command runs (it reads the environment)."""
    import cuforge

    package = os.path.dirname(os.path.abspath(cuforge.__file__))
    parts = [_FORMAT, cuforge.__version__.encode(), package.encode(), sys.executable.encode()]
    parts.append(os.getcwd().encode("utf-8", "surrogateescape"))
    parts.append(b"argv")
    parts += [a.encode("utf-8", "surrogateescape") for a in argv]
    parts.append(b"env")
    for key in sorted(os.environ):
        if (key.startswith("CUFORGE_") and key not in _ENV_UNNAMED) or key in _ENV_NAMES:
            parts.append(f"{key}={os.environ[key]}".encode("utf-8", "surrogateescape"))
    # The settings files (cache, cap, arch, secret): a record made under others never
    # answers (their paths and stat identity, see _config.fingerprint).
    from cuforge.cli import _config

    parts.append(b"config")
    parts.append(_config.fingerprint())
    # The code that turns these arguments into cache keys: an edited (development)
    # install must not be answered by records its old code wrote.
    parts.append(b"code")
    for sub in _CODE_DIRS:
        folder = os.path.join(package, sub)
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.name.endswith(".py"):
                st = entry.stat()
                parts.append(
                    f"{sub}/{entry.name}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}".encode()
                )
    h = blake2b(digest_size=20, person=b"cuforge-direct")
    for part in parts:
        h.update(len(part).to_bytes(4, "little") + part)
    return h.hexdigest()


def _facts_digest(values: tuple[bytes, ...]) -> str:
    h = blake2b(digest_size=16, person=b"cuforge-facts")
    for v in values:
        h.update(len(v).to_bytes(4, "little") + v)
    return h.hexdigest()


def _source_digest(raw: bytes) -> str:
    return blake2b(raw, digest_size=20).hexdigest()


# -- the fast path -----------------------------------------------------------------
def serve(argv: Sequence[str], digest: str) -> int | None:
    """Answer ``cuforge compile ARGV`` (whose ``request_digest`` is ``digest``) from a
    hit record, or None (then run the full path).

    Prints exactly what the full path prints for the same hits and returns 0.
    """
    if any(a in ("-h", "--help", "--no-cache") for a in argv):
        return None
    folder = _records_dir()
    if folder is None:
        return None
    try:
        with open(os.path.join(folder, digest[:2], digest), "rb") as f:
            fields = f.read(1 << 20).split(b"\0")
        request = _check(fields)
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        # a damaged record (the full path rewrites it), or a file that cannot be
        # read now: the full path answers, and says why where it must
        return None
    return None if request is None else _serve_entries(*request)


def write_output(path: str, data: bytes, inputs: Container[tuple[int, int]]) -> bool:
    """Write ``data`` to the file ``path`` (created, or its old content replaced),
    unless it is the same file as one of ``inputs`` ((st_dev, st_ino), through
    links): then nothing is written and False. Raises OSError.

    The identity is read from the opened descriptor before anything is truncated,
    so a link to a source put at ``path`` after an earlier check is still refused
    (no check-then-open race). A device such as ``/dev/null`` is written as is.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in inputs:
            return False
        if stat.S_ISREG(st.st_mode):
            os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    return True


def _check(
    fields: list[bytes],
) -> tuple[str, str, list[tuple[str, str, bytes, str, str]], set[tuple[int, int]]] | None:
    """(cache root, output mode, outputs, the sources' identities) of a record that
    holds here and now, else None."""
    if fields[0] != _FORMAT:
        return None
    where, mode = os.fsdecode(fields[1]), fields[2].decode()
    pos = 3
    for _ in range(int(fields[pos])):
        fact, want = fields[pos + 1].decode(), fields[pos + 2].decode()
        pos += 2
        values = toolchain.stored_fact(fact)
        if values is None or _facts_digest(values) != want:
            return None
    pos += 1
    outputs = []
    sources: set[tuple[int, int]] = set()
    for _ in range(int(fields[pos])):
        source, source_digest, output, key, target, arch = (
            os.fsdecode(fields[pos + 1]),
            fields[pos + 2].decode(),
            os.fsdecode(fields[pos + 3]),
            bytes.fromhex(fields[pos + 4].decode()),
            fields[pos + 5].decode(),
            fields[pos + 6].decode(),
        )
        pos += 6
        try:
            with open(source, "rb") as f:
                if _source_digest(f.read()) != source_digest:
                    return None
                st = os.fstat(f.fileno())
                sources.add((st.st_dev, st.st_ino))
        except OSError:
            return None
        outputs.append((source, output, key, target, arch))
    if not outputs:
        return None
    if where.startswith("file:") and not os.path.isdir(os.path.join(where[5:], "entries")):
        return None
    return where, mode, outputs, sources


def _open(where: str) -> ProgramCacheResource | None:
    """The cache a record names (``file:<root>`` or ``url:<redis URL>``), or None."""
    if where.startswith("file:"):
        from cuforge.storage.filestream import FileStreamProgramCache

        return FileStreamProgramCache(where[5:])
    if where.startswith("url:"):
        from cuforge.storage.urls import open_cache

        return open_cache(where[4:], secret=None)
    return None


def _serve_entries(
    where: str,
    mode: str,
    outputs: list[tuple[str, str, bytes, str, str]],
    sources: set[tuple[int, int]],
) -> int | None:
    results = []
    try:
        cache = _open(where)
    except (OSError, ValueError, ImportError):  # refused now (made unsafe, a link,
        return None  # another owner...): the full path opens it again and says why
    if cache is None:
        return None
    from cuforge.storage import failopen

    try:
        # Looked up uncounted, counted once served: a request this path gives up on is
        # counted by the full path's own lookups, once.
        found: list[tuple[bytes, CacheEntry]] = []
        failopen.begin(cache)
        for source, output, key, target, arch in outputs:
            start = time.perf_counter()
            entry = failopen.lookup(cache, key, count=False)
            if entry is None:
                return None
            found.append((key, entry))
            results.append((source, output, target, arch, entry.data, start))
        for _, output, _, _, data, _ in results:
            try:
                written = write_output(output, data, sources)
            except OSError:
                written = False
            if not written:  # the full path writes it, or says why not
                return None
        for key, entry in found:
            failopen.tally(cache, key, entry)
        if os.environ.get("CUFORGE_RUN_JOURNAL"):  # a cuforge run job: into its warm set
            _journal(cache, [key for _, _, key, _, _ in outputs])
    finally:
        cache.close()
    from cuforge.cli._report import render

    now = time.perf_counter()
    report = [
        {
            "source": source,
            "arch": arch,
            "target": target,
            "output": output,
            "bytes": len(data),
            "ms": round((now - start) * 1000, 3),
            "cache": "hit",
        }
        for source, output, target, arch, data, start in results
    ]
    try:  # flushed here: a report stdout cannot take is said as that (cli.main)
        print(render(report, mode == "json"))
        sys.stdout.flush()
    except OSError as exc:
        from cuforge.cli import _stdout_error  # a closed pipe stays BrokenPipeError

        raise _stdout_error(exc) from None
    return 0


def _journal(cache: ProgramCacheResource, keys: list[bytes]) -> None:
    """Note the served ``keys`` in this process's journal of the ``cuforge run
    --warm-set`` job it belongs to, as the full path's recorder would have noted its
    lookups (``_pool.recording``); nothing outside such a job."""
    from cuforge.integrations.warmsets import Recorder, recording

    recorder = recording(cache, "cli")
    if isinstance(recorder, Recorder):
        for key in keys:
            recorder.note(key)
        recorder.close()


# -- writing records (after the full path) --------------------------------------------
def remember(
    digest: str, cache: object, mode: str, done: list[tuple[Any, ...]], url: str | None = None
) -> None:
    """Leave a hit record for the request ``digest`` names when every output
    qualifies (see the module docstring). ``done``: (SourceFile, Program, target,
    output path, binary) per output, all written. Best effort: never raises for the
    file system or a cache server that is down or hung.
    """
    from cuforge.compile.cache import tracks_headers
    from cuforge.compile.cache_key import program_key
    from cuforge.storage.base import ProgramCacheResource
    from cuforge.storage.entry import entry_id
    from cuforge.storage.filestream import FileStreamProgramCache
    from cuforge.storage.tiered import TieredProgramCache
    from cuforge.storage.urls import parse_cache_url

    folder = _records_dir()
    if folder is None or not done:
        return
    counts = cache.stats() if isinstance(cache, ProgramCacheResource) else None
    if counts is None or counts.read_failures or counts.write_failures:
        return  # a level failed in this run: no record (and no read-back to wait for)
    if type(cache) is TieredProgramCache:  # served by its first persistent level
        front, cache_ro = cache.first_persistent(), cache.read_only
        if front is None:
            return
        index, cache = front
        if index in cache_ro:  # this path would open it writable: never
            return
        url = parse_cache_url(url)[index].text if url else None
    if type(cache) is FileStreamProgramCache:
        where = b"file:" + os.fsencode(cache.path)
    elif url and (
        (_is(cache, "redis", "RedisProgramCache") and "@" not in url)
        or _is(cache, "s3", "S3ProgramCache")  # an s3:// URL never holds credentials
    ):
        where = b"url:" + url.encode()
    else:
        return
    if not isinstance(cache, ProgramCacheResource):
        return
    facts = []
    for fact, current in toolchain.key_facts():
        values = toolchain.stored_fact(fact)
        if values is None or values[0] != current:
            return  # not (yet) on disk, or not what these keys were made from
        facts.append((fact, _facts_digest(values)))
    outputs = []
    for source, program, target, output, code in done:
        if program.code_type != "c++" or tracks_headers(program):
            return
        if target == "ptx":
            return  # a PTX hit may warn about the driver (compile.cache): full path only
        key = program_key("c++", target, program.options, program.source.code, (), None)
        try:
            stored = cache.read_entry(entry_id(key))
        except (OSError, ValueError):  # a server that is down or hung: no record, and
            return  # the command, which has done its work, does not fail for it
        if stored is None or stored.data != code:
            return  # the key is not what the compile used: never record a guess
        outputs.append((source, output, key, target, program.options.arch))
    fields = [_FORMAT, where, mode.encode(), str(len(facts)).encode()]
    for fact, fact_digest in facts:
        fields += [fact.encode(), fact_digest.encode()]
    fields.append(str(len(outputs)).encode())
    for source, output, key, target, arch in outputs:
        fields += [
            os.fsencode(source.path),
            _source_digest(source.raw).encode(),
            os.fsencode(output),
            key.hex().encode(),
            target.encode(),
            arch.encode(),
        ]
    _write(folder, digest, b"\0".join(fields))


def _write(folder: str, digest: str, data: bytes) -> None:
    shard = os.path.join(folder, digest[:2])
    path = os.path.join(shard, digest)
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        _private_dir(folder)
        _private_dir(shard)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        names = [n for n in os.listdir(shard) if _is_record_name(n, digest[:2])]
        if len(names) > _SHARD_MAX:
            from cuforge.storage.ownership import delete_owned

            aged = sorted((os.lstat(os.path.join(shard, n)).st_mtime_ns, n) for n in names)
            delete_owned(
                [name for _, name in aged[: len(aged) // 2]],
                lambda name: _is_record_name(name, digest[:2]),
                lambda own: _unlink_all(shard, own),
                shard,
            )
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            return


def _is_record_name(name: str, shard: str) -> bool:
    """Whether ``name`` is a hit record's name in ``shard``: the request digest (40
    lowercase hex digits) starting with the shard's two. Pruning removes only these:
    anything else in the folder is not this path's to delete."""
    return len(name) == 40 and name.startswith(shard) and all(c in "0123456789abcdef" for c in name)


def _unlink_all(folder: str, names: list[str]) -> int:
    removed = 0
    for name in names:
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            continue
        removed += 1
    return removed


def _private_dir(path: str) -> None:
    """Make the directory ``path`` (0700), or make it private when an older cuforge
    left it open to others (``os.makedirs`` gave ``cli-hits/`` the umask's 0755: its
    ``mode`` reaches only the last level); a link or another user's is left alone."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
    if stat.S_ISDIR(st.st_mode) and mine and st.st_mode & 0o077:
        os.chmod(path, 0o700)


def _is(cache: object, backend: str, name: str) -> bool:
    """Whether ``cache`` is exactly that backend's handle class, looked up only if its
    module is loaded (a cache of that class exists only once it is; importing the
    class here cost every compile ~30 ms)."""
    cls = getattr(sys.modules.get(f"cuforge.storage.{backend}._cache"), name, None)
    return cls is not None and type(cache) is cls
