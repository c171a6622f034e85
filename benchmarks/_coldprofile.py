"""Where a cold compile through cuforge spends its time: every process, every thread.

A profile run (``bench_coldtriton.py --profile``, ``bench_coldstart.py --profile``)
puts ``benchmarks/_profilesite`` first on ``PYTHONPATH`` and ``COLDPROFILE_DIR`` in
the environment, so every Python process of the run -- Inductor's compile workers
included -- imports :func:`install` at start-up. It times cuforge's own functions as
they are called: the open, the import of the Triton integration, each lookup, each
store and its parts (the key's digest, the HMAC, the framing, the two files, the size
ledger), the single-flight lock, the local copy Triton reads, the write-behind queue.
Only cuforge's modules are touched, each wrapped right after it is first imported;
a process that never imports cuforge pays nothing but the hook.

Each call appends one line ``label<TAB>thread<TAB>wall s<TAB>CPU s`` to
``DIR/<pid>.tsv`` (one ``write`` per call, so a process ended by a signal keeps what it
measured; CPU is the calling thread's); thread is ``behind`` for the write-behind
thread, else ``inline`` (the compile waits for it).
Times are inclusive: a store's parts are inside its total. :func:`summarize` folds
the files into one table per process role (the process that compiled, and the
processes it started: Inductor's compile workers). A profile run is slower than a
plain one by the probes themselves; its figures are a breakdown, not a timing.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
import time
from typing import Any

ENV = "COLDPROFILE_DIR"

#: (module, attribute path, label) in the order the table shows them; each module's
#: attributes are wrapped right after it is first imported. Indented labels are parts
#: of the one above.
PROBES: list[tuple[str, str, str]] = [
    ("cuforge.integrations._cache", "_open", "open the cache (per process)"),
    ("cuforge.integrations.triton", "CuforgeCacheManager.get_group", "triton: kernel lookup"),
    ("cuforge.integrations.triton", "CuforgeCacheManager._take_lock", "  single-flight lock: take"),
    ("cuforge.integrations.triton", "CuforgeCacheManager.get_file", "triton: file lookup"),
    ("cuforge.integrations.triton", "CuforgeCacheManager.put", "triton: put a file"),
    ("cuforge.integrations.triton", "CuforgeCacheManager.put_group", "triton: put a group"),
    ("cuforge.integrations.triton", "_put_local", "  the local copy Triton reads (put)"),
    ("cuforge.integrations.triton", "_materialize", "  the local copy Triton reads (hit)"),
    ("cuforge.integrations.triton", "_let_go", "single-flight lock: let go"),
    ("cuforge.integrations._cache", "ForeignEntries.load", "inductor: remote get"),
    ("cuforge.integrations._cache", "ForeignEntries.store", "inductor: remote put"),
    ("cuforge.integrations._behind", "submit", "write-behind: queue a store"),
    ("cuforge.integrations._behind", "flush", "write-behind: wait for the queue"),
    ("cuforge.storage.handle", "DriverCache.get_entry", "lookup (get_entry)"),
    ("cuforge.storage.handle", "DriverCache.get_entries", "lookup (get_entries)"),
    ("cuforge.storage.handle", "DriverCache._hold", "per-key lock + lease (lock())"),
    ("cuforge.storage.filestream._locking", "FileKeyLock._acquire", "  lock file: take"),
    ("cuforge.storage.signing", "SignedProgramCache.set_entry", "store, signed"),
    ("cuforge.storage.signing", "SignedProgramCache._sign", "  HMAC-SHA256"),
    ("cuforge.storage.handle", "DriverCache.set_entry", "  store (set_entry)"),
    ("cuforge.storage.handle", "key_digest", "    key digest (blake2b)"),
    ("cuforge.storage.filestream._driver", "FileStreamDriver.write", "    directory store"),
    ("cuforge.storage.filestream._driver", "sidecar_for", "      framing: CRC + sidecar"),
    ("cuforge.storage.filestream._atomicwrite", "PairWriter.write_pair", "      two files"),
    ("cuforge.storage.filestream._sizeindex", "SizeLedger.add", "      size ledger"),
    ("triton.runtime.cache", "FileCacheManager.get_group", "stock triton: kernel lookup"),
    ("triton.runtime.cache", "FileCacheManager.put", "stock triton: put a file"),
    ("triton.runtime.cache", "FileCacheManager.put_group", "stock triton: put a group"),
]
IMPORT_LABEL = "import cuforge's triton integration"
LABELS = [IMPORT_LABEL] + [label for _, _, label in PROBES]
MODULES = {module for module, _, _ in PROBES}

_fd: list[int] = []  # this process's file (reopened after a fork)
_pid: list[int] = []


def _emit(label: str, seconds: float, cpu: float = 0.0) -> None:
    pid = os.getpid()
    if not _pid or _pid[0] != pid:
        _pid[:] = [pid]
        path = os.path.join(os.environ[ENV], f"{pid}.tsv")
        _fd[:] = [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)]
    behind = sys.modules.get("cuforge.integrations._behind")
    writer = getattr(behind, "writer_ident", None)
    thread = "behind" if writer is not None and writer() == threading.get_ident() else "inline"
    os.write(_fd[0], f"{label}\t{thread}\t{seconds:.9f}\t{cpu:.9f}\n".encode())


def _timed(fn: Any, label: str) -> Any:
    clock = time.perf_counter
    if getattr(fn, "__wrapped_by_coldprofile__", False):
        return fn

    cpu_clock = time.thread_time

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        c0, t0 = cpu_clock(), clock()
        try:
            return fn(*args, **kwargs)
        finally:
            _emit(label, clock() - t0, cpu_clock() - c0)

    wrapper.__wrapped_by_coldprofile__ = True  # type: ignore[attr-defined]
    return wrapper


def _patch(module: Any, name: str) -> None:
    for mod, path, label in PROBES:
        if mod != name:
            continue
        owner = module
        *parents, attr = path.split(".")
        for p in parents:
            owner = getattr(owner, p, None)
        fn = getattr(owner, attr, None) if owner is not None else None
        if fn is not None:
            setattr(owner, attr, _timed(fn, label))


class _Hook:
    """Wraps a target module's functions right after its own code ran; times the
    import of the Triton integration itself."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in MODULES or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy.discard(name)
        loader = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if spec is None or run is None:
            return None

        def exec_module(module: Any) -> None:
            c0, t0 = time.thread_time(), time.perf_counter()
            run(module)
            if name == "cuforge.integrations.triton":
                _emit(IMPORT_LABEL, time.perf_counter() - t0, time.thread_time() - c0)
            _patch(module, name)

        loader.exec_module = exec_module  # type: ignore[union-attr]
        return spec

    def invalidate_caches(self) -> None:
        return None


def install() -> None:
    """Profile this process when ``$COLDPROFILE_DIR`` is set (see the module docstring)."""
    if not os.environ.get(ENV):
        return
    for name in MODULES:
        if name in sys.modules:
            _patch(sys.modules[name], name)
    sys.meta_path.insert(0, _Hook())


def summarize(directory: str, main_pid: int) -> dict[str, Any]:
    """``{role: {label: {calls, inline_s, behind_s}}}`` over every process's file;
    role ``main`` is ``main_pid``, ``workers`` every other process (summed), and
    ``processes`` how many wrote a file."""
    out: dict[str, Any] = {"main": {}, "workers": {}, "processes": 0}
    for entry in sorted(os.listdir(directory)):
        if not entry.endswith(".tsv"):
            continue
        out["processes"] += 1
        role = "main" if entry == f"{main_pid}.tsv" else "workers"
        with open(os.path.join(directory, entry)) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) != 4:
                    continue  # a line cut by a kill
                label, thread, seconds, cpu = parts
                row = out[role].setdefault(
                    label,
                    {"calls": 0, "inline_s": 0.0, "behind_s": 0.0, "inline_cpu_s": 0.0,
                     "behind_cpu_s": 0.0},
                )  # fmt: skip
                row["calls"] += 1
                row[f"{thread}_s"] += float(seconds)
                row[f"{thread}_cpu_s"] += float(cpu)
    return out


def table(summary: dict[str, Any]) -> str:
    """The summary as text: per role, each label's calls, and its wall and CPU ms in
    the compiling threads (inline) and in the writer thread (behind)."""
    lines = []
    for role in ("main", "workers"):
        rows = summary.get(role) or {}
        if not rows:
            continue
        lines.append(f"  {role} process{'es' if role == 'workers' else ''}:")
        head = (
            f"{'calls':>6s} {'inline ms':>10s} {'inline CPU':>10s} {'behind ms':>10s} "
            f"{'behind CPU':>10s}"
        )
        lines.append(f"    {'':44s} {head}")
        for label in sorted(rows, key=_order):
            r = rows[label]
            lines.append(
                f"    {label:44s} {r['calls']:6d} {1e3 * r['inline_s']:10.2f} "
                f"{1e3 * r['inline_cpu_s']:10.2f} {1e3 * r['behind_s']:10.2f} "
                f"{1e3 * r['behind_cpu_s']:10.2f}"
            )
    return "\n".join(lines)


def _order(label: str) -> tuple[int, str]:
    return (LABELS.index(label) if label in LABELS else len(LABELS), label)
