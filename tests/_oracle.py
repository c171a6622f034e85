"""The differential oracle (issue 32): every way cuforge can answer a compile, checked
against an uncached compile made at the same moment.

:class:`Oracle` holds a :class:`~_oracle_world.World` and, after each change to it,
:meth:`Oracle.check` compiles the world's two programs (``k`` reads user headers,
``p`` reads none) through every path and requires each answer to be byte-identical
to ``Program(...).compile("cubin")`` without a cache -- or, where that compile fails,
to fail too:

- ``api watched [memory|filestream|sqlite|tier]``: ``Program.compile(cache=)`` in
  this long-running process, whose header watcher (inotify) is on, twice each;
- ``api unwatched [...]``: the same in a long-running child process started with
  ``CUFORGE_WATCH=0`` (:class:`Child`; JSON lines over stdin/stdout), so the stat
  validation answers;
- ``cli -v``: ``cuforge -v compile`` (the full path: ``-v`` makes the fast hit path
  step aside); ``cli``: ``cuforge compile`` twice for p (the second, at the latest,
  is the fast hit path's) and once for k (reads headers: never the fast path's);
- ``warm``: ``cuforge warm`` of a manifest naming both, then ``cuforge -v compile``
  from its cache, which must hit what warm stored and equal the uncached compile.

The persistent caches are shared, as on a real machine: the API in both processes,
the CLI and the second process of :meth:`Oracle.second_process_writes` use the same
FileStream directory; both processes share the SQLite file and the tier's file level.
Every CLI run goes through ``tests/_fake_device.py`` (device 0 reports the world's
device arch); in process, and in the child, ``_versions.current_device_arch`` is
stood in for the same way (:func:`device`). Nothing else is faked.

``CUFORGE_TOOLKIT_HEADERS`` is read once per process, so a change of it reaches the
processes a step starts (CLI, warm), not the long-running two: their expected answer
is then the CLI's own uncached compile (``--no-cache``) in that environment.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as the child process's script
    sys.path.insert(0, str(HERE))

from _cli import isolated_env  # noqa: E402
from _oracle_world import TARGET, Job, World, describe  # noqa: E402

FAKE_DEVICE = HERE / "_fake_device.py"
BACKENDS = ("memory", "filestream", "sqlite", "tier")
PERSISTENT = ("filestream", "sqlite", "tier")
#: The paths a check compiles through, for the figure.
PATHS = (
    "the API x memory/FileStream/SQLite/tier in a watched and an unwatched process, "
    "cuforge compile's full path and fast hit path, cuforge warm"
)


def record(*args: Any, **kwargs: Any) -> None:
    """``tests/reliability/_figures.record``: the figure docs/reliability.md's table shows."""
    if str(HERE / "reliability") not in sys.path:
        sys.path.append(str(HERE / "reliability"))
    from _figures import record as write

    write(*args, **kwargs)


@dataclass(frozen=True)
class Outcome:
    """One path's answer: ``code`` (bytes), a ``compile-error`` (the compiler refused
    the source), or a ``failure`` (anything else: never equal to an expected answer)."""

    kind: str
    code: bytes = b""
    text: str = ""  # the error's first line
    note: str = ""  # what the path said (CLI: "cache hit", ...)

    def same_as(self, other: Outcome) -> bool:
        if self.kind == other.kind == "code":
            return self.code == other.code
        return self.kind == other.kind == "compile-error"

    def shown(self) -> str:
        what = {"code": describe(self.code), "compile-error": f"compile error ({self.text})",
                "failure": f"FAILED: {self.text}"}[self.kind]  # fmt: skip
        return f"{what} [{self.note}]" if self.note else what

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "code": base64.b64encode(self.code).decode(),
                "text": self.text, "note": self.note}  # fmt: skip

    @classmethod
    def from_json(cls, d: dict[str, str]) -> Outcome:
        return cls(d["kind"], base64.b64decode(d["code"]), d["text"], d["note"])


# -- compiling in a process ----------------------------------------------------------------
@contextlib.contextmanager
def device(arch: str) -> Iterator[None]:
    """Device 0 reports ``arch`` to ``ProgramOptions`` (the one stand-in: no machine
    here can change its GPU; cf. tests/_fake_device.py for the CLI)."""
    from cuforge.compile import _versions  # ProgramOptions looks it up there at each call

    real = _versions.current_device_arch
    _versions.current_device_arch = lambda: arch
    try:
        yield
    finally:
        _versions.current_device_arch = real


@contextlib.contextmanager
def working_dir(path: Path | str) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def compile_one(job: Job, cache: Any) -> Outcome:
    """``job`` compiled through ``cache`` (None: uncached), as an Outcome."""
    from cuforge.compile import CompileError, Program, ProgramOptions

    try:
        program = Program(job.code, "c++", ProgramOptions(**job.fields))
        obj = program.compile(TARGET) if cache is None else program.compile(TARGET, cache=cache)
    except CompileError as exc:
        return Outcome("compile-error", text=_first_line(str(exc)))
    except Exception as exc:
        return Outcome("failure", text=f"{type(exc).__name__}: {exc}")
    return Outcome("code", bytes(obj.code))


def open_caches(root: Path, names: tuple[str, ...] = BACKENDS) -> dict[str, Any]:
    """The API's caches over the world's shared files (memory levels are private)."""
    from cuforge.storage import (
        FileStreamProgramCache,
        InMemoryProgramCache,
        SQLiteProgramCache,
        TieredProgramCache,
    )

    caches = root / "caches"
    make = {
        "memory": lambda: InMemoryProgramCache(),
        "filestream": lambda: FileStreamProgramCache(caches / "fs"),
        "sqlite": lambda: SQLiteProgramCache(caches / "api.db"),
        "tier": lambda: TieredProgramCache(
            InMemoryProgramCache(), FileStreamProgramCache(caches / "tier-fs")
        ),
    }
    return {name: make[name]() for name in names}


def compile_through(
    caches: dict[str, Any], jobs: list[Job], cwd: str, arch: str, times: int
) -> dict[str, Outcome]:
    """Each job through each cache ``times`` times: ``{"[backend] label #n": Outcome}``."""
    out = {}
    with device(arch), working_dir(cwd):
        for name, cache in caches.items():
            for job in jobs:
                for n in range(1, times + 1):
                    out[f"[{name}] {job.label} #{n}"] = compile_one(job, cache)
    return out


def uncached(jobs: list[Job], cwd: str, arch: str) -> dict[str, Outcome]:
    with device(arch), working_dir(cwd):
        return {job.label: compile_one(job, None) for job in jobs}


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0][:200] if lines else ""


# -- the long-running unwatched process ------------------------------------------------------
class Child:
    """A long-running process with ``CUFORGE_WATCH=0``, compiling on request.

    Protocol: one JSON object per line each way. ``{"op": "open", "root": R}`` opens
    the caches of the world at R (closing the last ones); ``{"op": "compile", "jobs":
    [...], "cwd": C, "arch": A, "times": N}`` answers ``{"results": {name: Outcome}}``
    as :func:`compile_through` does; ``{"op": "exit"}`` ends it. Its stderr goes to
    ``log`` (shown when it dies).
    """

    def __init__(self, log: Path) -> None:
        self.log = log
        env = {**os.environ, "CUFORGE_WATCH": "0"}
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__)), "child"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=HERE,
            )  # fmt: skip

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError:
            line = ""
        if not line:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the unwatched child process died; its stderr:\n{tail}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ask({"op": "exit"})
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=30)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _serve_child() -> None:
    out = os.fdopen(os.dup(1), "w")  # answers only: anything else printed goes to stderr
    os.dup2(2, 1)
    caches: dict[str, Any] = {}
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "exit":
            break
        if req["op"] == "open":
            for cache in caches.values():
                cache.close()
            caches = open_caches(Path(req["root"]), tuple(req.get("backends", BACKENDS)))
            answer: dict[str, Any] = {"ok": True}
        else:
            jobs = [Job.from_json(j) for j in req["jobs"]]
            done = compile_through(caches, jobs, req["cwd"], req["arch"], req["times"])
            answer = {"results": {k: v.to_json() for k, v in done.items()}}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    for cache in caches.values():
        cache.close()


def _write_once(request: str) -> None:
    """One short-lived process: compile the jobs into the world's persistent caches."""
    req = json.loads(request)
    caches = open_caches(Path(req["root"]), PERSISTENT)
    jobs = [Job.from_json(j) for j in req["jobs"]]
    done = compile_through(caches, jobs, req["cwd"], req["arch"], 1)
    for cache in caches.values():
        cache.close()
    print(json.dumps({k: v.to_json() for k, v in done.items()}))


# -- the command line ----------------------------------------------------------------------------
def run_cli(world: World, env: dict[str, str], args: list[str], output: Path) -> Outcome:
    """``cuforge ARGS`` (device 0: the world's arch) in the working directory; the
    Outcome is the file it wrote to ``output`` (removed first)."""
    output.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, str(FAKE_DEVICE), *args], cwd=world.cwd_path, env=env,
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    if done.returncode == 1 and "Traceback" not in done.stderr:
        return Outcome("compile-error", text=_first_line(done.stderr))
    if done.returncode != 0 or not output.exists():
        tail = (done.stderr.strip() or done.stdout.strip())[-800:]
        return Outcome("failure", text=f"exit {done.returncode}: {tail}")
    note = done.stdout.strip().rsplit(", ", 1)[-1] if "--json" not in args else ""
    if "--json" in args:
        with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
            note = f"cache {json.loads(done.stdout)[0]['cache']}"
    return Outcome("code", output.read_bytes(), note=note)


class Oracle:
    """A world, the API's caches in this process, the unwatched child, and the check."""

    def __init__(self, root: Path, child: Child, state_dir: Path) -> None:
        self.world = World(root)
        self.state_dir = state_dir
        self.caches = open_caches(root)
        self.child = child
        child.ask({"op": "open", "root": str(root)})
        self.checks = 0
        self.seconds: dict[str, float] = {}

    def close(self) -> None:
        for cache in self.caches.values():
            cache.close()

    def _timed(self, what: str, start: float) -> None:
        self.seconds[what] = self.seconds.get(what, 0.0) + time.perf_counter() - start

    def env(self) -> dict[str, str]:
        """The environment of a CLI run now."""
        w = self.world
        return isolated_env(w.root, TEST_DEVICE0_ARCH=w.device_arch,
                            CUFORGE_STATE_DIR=str(self.state_dir), **w.toolkit_env())  # fmt: skip

    # -- the check ---------------------------------------------------------------------
    def check(self) -> None:
        """Compile through every path; AssertionError with a report where any answer
        differs from the uncached compile of this moment."""
        w = self.world
        jobs, cwd, arch = w.jobs(), str(w.cwd_path), w.device_arch
        self.checks += 1
        env = self.env()
        # The warm chain uses a cache of its own: it runs beside the rest (2 cores).
        pool = ThreadPoolExecutor(1)
        warmed = pool.submit(self._warm, jobs, env)
        start = time.perf_counter()
        expected = uncached(jobs, cwd, arch)
        self._timed("uncached", start)
        got: list[tuple[str, str, Outcome]] = []  # (path, job label, outcome)

        start = time.perf_counter()
        for name, o in compile_through(self.caches, jobs, cwd, arch, 2).items():
            got.append((f"api watched {name}", name.split()[1], o))
        self._timed("api watched", start)

        start = time.perf_counter()
        req = {"op": "compile", "jobs": [j.to_json() for j in jobs], "cwd": cwd,
               "arch": arch, "times": 2}  # fmt: skip
        for name, d in self.child.ask(req)["results"].items():
            got.append((f"api unwatched {name}", name.split()[1], Outcome.from_json(d)))
        self._timed("api unwatched", start)

        start = time.perf_counter()
        sub_expected = expected if w.toolkit is None else self._cli_uncached(jobs, env)
        self._timed("cli uncached", start)
        start = time.perf_counter()
        got += self._cli(jobs, env)
        self._timed("cli", start)
        start = time.perf_counter()
        got += warmed.result()
        pool.shutdown()
        self._timed("warm (waited for)", start)

        wrong = []
        for path, label, outcome in got:
            want = (expected if path.startswith("api") else sub_expected)[label]
            if not outcome.same_as(want):
                wrong.append(f"  {path}: got {outcome.shown()}\n    expected {want.shown()}")
        if wrong:
            raise AssertionError(self.report(expected, sub_expected, wrong))

    def report(
        self, expected: dict[str, Outcome], sub_expected: dict[str, Outcome], wrong: list[str]
    ) -> str:
        w = self.world
        lines = [f"issue 32 oracle: {len(wrong)} answer(s) differ from an uncached compile",
                 f"world: {w.root}", "steps:"]  # fmt: skip
        lines += [f"  {i}. {step}" for i, step in enumerate(w.log, 1)] or ["  (none)"]
        lines.append(f"now: {w.state()}")
        for label, want in expected.items():
            lines.append(f"uncached compile of {label}: {want.shown()}")
            if sub_expected is not expected:
                lines.append(f"  (CLI, with {w.toolkit_env()}): {sub_expected[label].shown()}")
        lines.append("wrong:")
        return "\n".join(lines + wrong)

    def _out(self, name: str) -> Path:
        return self.world.root / "out" / f"{name}.{TARGET}"

    def _cli_uncached(self, jobs: list[Job], env: dict[str, str]) -> dict[str, Outcome]:
        found = {}
        for j in jobs:
            out = self._out(f"{j.label}-uncached")
            args = ["compile", *j.cli, "--no-cache", "-o", str(out)]
            found[j.label] = run_cli(self.world, env, args, out)
        return found

    def _cli(self, jobs: list[Job], env: dict[str, str]) -> list[tuple[str, str, Outcome]]:
        cache = ["--cache", str(self.world.root / "caches" / "fs")]
        runs = []
        by = {j.label: j for j in jobs}
        for path, label in (("cli -v", "p"), ("cli #1", "p"), ("cli #2", "p"), ("cli", "k")):
            out = self._out(f"{label}-cli")
            args = ["compile", *by[label].cli, "-o", str(out), *cache]
            if path == "cli -v":  # the full path: -v makes the fast hit path step aside
                args.insert(0, "-v")
            runs.append((f"{path} {label}", label, run_cli(self.world, env, args, out)))
        return runs

    def _warm(self, jobs: list[Job], env: dict[str, str]) -> list[tuple[str, str, Outcome]]:
        """``cuforge warm`` into its own cache, then ``cuforge -v compile`` from it."""
        w = self.world
        arch = w.effective_arch()
        cache = str(w.root / "caches" / "warm")
        manifest = w.cwd_path / "oracle-warm.toml"
        text = "".join(_kernel_toml(j, arch) for j in jobs)
        if not manifest.exists() or manifest.read_text() != text:
            manifest.write_text(text)
        done = subprocess.run(
            [sys.executable, str(FAKE_DEVICE), "warm", str(manifest), "--cache", cache, "--json"],
            cwd=w.cwd_path, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        try:
            status = {r["source"]: r for r in json.loads(done.stdout)["results"]}
        except (ValueError, KeyError, TypeError):
            failed = Outcome("failure", text=f"warm exit {done.returncode}: {done.stderr[-800:]}")
            return [(f"warm {j.label}", j.label, failed) for j in jobs]
        runs = []
        for j in jobs:
            r = status.get(j.source, {})
            out = self._out(f"{j.label}-warm")
            args = [*j.cli, *([] if j.fields["arch"] else ["--arch", arch])]
            o = run_cli(w, env, ["-v", "compile", *args, "-o", str(out), "--cache", cache,
                                 "--json"], out)  # fmt: skip
            said = r.get("status", "?") + (f" (not stored: {r['not_stored']})"
                                           if r.get("not_stored") else "")  # fmt: skip
            stored = said in ("cached", "compiled")
            if stored and o.kind == "code" and o.note != "cache hit":
                o = Outcome("failure", text=f"warm said {said}, the compile after it: {o.note}")
            o = Outcome(o.kind, o.code, o.text, f"warm {said}, then {o.note}")
            runs.append((f"warm {j.label}", j.label, o))
        return runs

    # -- a second process -------------------------------------------------------------
    def second_process_writes(self, header: str | None, restore: bool) -> None:
        """Another process compiles both programs into the shared caches -- after
        ``header`` is edited in place (then, with ``restore``, put back in place)."""
        w = self.world
        path = w.root / header if header else None
        saved = path.read_bytes() if path is not None and path.is_file() else None
        if header:
            w.edit_header(header, "in place")
        jobs = w.jobs()
        req = {"root": str(w.root), "jobs": [j.to_json() for j in jobs],
               "cwd": str(w.cwd_path), "arch": w.device_arch}  # fmt: skip
        done = subprocess.run(
            [sys.executable, str(Path(__file__)), "once", json.dumps(req)], cwd=HERE,
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the second process failed: {done.stderr[-2000:]}")
        seen = {k.split()[1]: Outcome.from_json(v) for k, v in json.loads(done.stdout).items()}
        w.log.append("a second process compiled into the shared caches: "
                     + "; ".join(f"{k}: {v.shown()}" for k, v in seen.items()))  # fmt: skip
        if restore and path is not None and saved is not None:
            with open(path, "r+b") as f:
                f.write(saved)
                f.truncate()
            w.log.append(f"put {header} back in place: {saved.decode().strip()!r}")


def _kernel_toml(job: Job, arch: str) -> str:
    f = job.fields
    lines = ["[[kernel]]", f"source = {json.dumps(job.source)}", f"arch = [{json.dumps(arch)}]"]
    if f.get("include_path"):
        lines.append(f"includes = {json.dumps(f['include_path'])}")
    if f.get("define_macro"):
        lines.append(f"defines = {json.dumps(f['define_macro'])}")
    if f.get("std"):
        lines.append(f"std = {json.dumps(f['std'])}")
    return "\n".join(lines) + "\n\n"


if __name__ == "__main__":
    if sys.argv[1] == "child":
        _serve_child()
    elif sys.argv[1] == "once":
        _write_once(sys.argv[2])
