"""``cuforge run [--cache URL] [--warm-set NAME] [--warm] -- CMD ...``: run a job with
every JIT cuforge knows wired to one cache.

Before the job starts: the cache is chosen as every command chooses it (``_select``)
and opened (a bad one is a usage error, exit 2); the warm set ``NAME``, if there is
one, is prefetched into the cache's local level (``warmsets``); the directory
caches of directory-only JITs are hydrated (the mirror profiles active in the
environment: Warp, Numba, Inductor's C++ libraries, ..., and the settings files'
``[mirror.<name>]`` profiles: ``mirror.configured_profiles``, read before the job
starts; a bad one is a usage error naming the file and the key).

The job's environment is the user's (not this command's own: the ``CUFORGE_WATCH=0``
the command line sets for itself is not handed on) plus the wiring, nothing else:
``$CUFORGE_RUN=1`` (the start-up hook's switch); ``$CUFORGE_CACHE`` and every
integration's own variable (``_ADAPTER_VARS``) name the chosen cache; a secret read
from a file (a settings file's ``secret_file``, or ``$CUFORGE_CACHE_SECRET_FILE``)
is passed as that file's path in ``$CUFORGE_CACHE_SECRET_FILE``, never as the secret
(a ``$CUFORGE_CACHE_SECRET`` the user set is theirs, and left as it is);
``TRITON_CACHE_MANAGER`` is cuforge's (when unset); Inductor's remote FX-graph and
AOT-autograd caches are on (unless set); the run's start-up hook
(``cuforge/integrations/_boot``) leads ``PYTHONPATH``, so each Python process of the
job wires JAX, Inductor, CuPy and Triton to the cache when it imports them
(``_bootstrap``) -- no code change. ``--warm-set`` sets ``$CUFORGE_RUN_JOURNAL`` (the
journals' directory; removed otherwise), ``--warm`` sets ``$CUFORGE_WARM=1`` (every
compile in the job is then warned about and counted), and ``$CUFORGE_RUN_QUIET=1``
is set when the job's Python cannot import cuforge (said once here). With caching
off the job gets the user's environment unchanged. docs/cache.md ("Which cache")
lists these for users.

While it runs, signals are passed on (SIGINT only when it did not already reach the
job from the terminal), and what the job added -- the mirrored directories, the
keys its processes read or stored -- is published every ``--publish-every``
(default 60 s), so a killed job loses little. When it ends, all is published once
more; the warm set becomes exactly what this run read or stored when the job
exited 0, and is added to otherwise; a job that read or stored nothing through
the cache leaves it as it was (one warning says so).

Exit status: the job's (128 + N when signal N ended it); 2 for a usage error (no
command, a command that cannot be started -- not found, not executable, a directory
-- a bad cache or warm-set name, a bad mirror profile in a settings file, a
``$CUFORGE_WARM`` or ``$CUFORGE_TOOLKIT_HEADERS`` that ``compile`` refuses).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from cuforge.cli import _select, job_environment
from cuforge.cli._args import UsageError, duration_arg
from cuforge.storage.config import ENV_SECRET_FILE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cuforge.cli._args import Subparsers
    from cuforge.storage.base import ProgramCacheResource

__all__ = ["child_env", "register"]

#: Each integration's own cache variable: the job gets the run's cache in all of them.
_ADAPTER_VARS = (
    "CUFORGE_TRITON_CACHE",
    "CUFORGE_INDUCTOR_CACHE",
    "CUFORGE_CUPY_CACHE",
    "CUFORGE_JAX_CACHE",
    "CUFORGE_MIRROR_CACHE",
)
#: Inductor's switches for the remote caches cuforge serves (left alone when set).
_INDUCTOR_SWITCHES = ("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE")
#: Signals passed on to the job (SIGINT: see ``_forward``).
_FORWARDED = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGINT")


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "run",
        help="run a command with every JIT wired to one cache",
        description="Run CMD with Triton, Inductor, JAX, CuPy and directory-cache JITs "
        "wired to one cuforge cache; prefetch and record a warm set.",
    )
    p.add_argument("--warm-set", metavar="NAME", help="prefetch this warm set, and record into it")
    p.add_argument(
        "--warm",
        action="store_true",
        help="the job is warm from the start: warn once per kernel compiled, count each compile",
    )
    p.add_argument(
        "--publish-every", type=duration_arg, default=60.0, metavar="DURATION",
        help="publish what the job added this often (default 60s)",
    )  # fmt: skip
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the job")
    p.set_defaults(handler=_run)
    _select.add_cache_option(p, can_disable=False)


def child_env(
    base: dict[str, str],
    url: str | None,
    journal: str | None,
    warm: bool,
    secret_file: str = "",
) -> dict[str, str]:
    """The job's environment: ``base`` (the user's: ``cli.job_environment``) plus the
    wiring (see the module docstring). ``secret_file``: the file the chosen cache's
    secret was read from ("" when it came from ``$CUFORGE_CACHE_SECRET``, already in
    ``base``, or there is none), handed on by its path in
    ``$CUFORGE_CACHE_SECRET_FILE``: the secret never enters the job's environment."""
    env = dict(base)
    boot = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "integrations", "_boot")  # fmt: skip
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != boot]
    env["PYTHONPATH"] = os.pathsep.join([boot, *paths])
    env["CUFORGE_RUN"] = "1"
    if url is not None:
        env["CUFORGE_CACHE"] = url
        if secret_file:  # read by the job's processes as this one read it
            env[ENV_SECRET_FILE] = secret_file
        for name in _ADAPTER_VARS:
            env[name] = url
        env.setdefault("TRITON_CACHE_MANAGER", "cuforge.integrations.triton:CuforgeCacheManager")
        for name in _INDUCTOR_SWITCHES:
            env.setdefault(name, "1")
    if journal is not None:
        env["CUFORGE_RUN_JOURNAL"] = journal
    else:
        env.pop("CUFORGE_RUN_JOURNAL", None)
    if warm:
        env["CUFORGE_WARM"] = "1"
    return env


def _run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("a command is required: cuforge run [--cache URL] -- CMD ...")
    if args.warm_set is not None:
        from cuforge.integrations.warmsets import set_key

        try:
            set_key(args.warm_set)
        except ValueError as exc:
            raise UsageError(f"--warm-set: {exc}") from None
    # the variables compile refuses, refused before the job starts (it would hand
    # them to every process of the job): the same lines, from the same checks
    from cuforge.cli import _programs

    _programs.check_warm_setting()
    _programs.check_environment()
    profiles = _profiles()
    chosen = _select.choose(args)
    if chosen.url is None:  # caching off: the job runs as it would without cuforge
        return _wait(_start(command, job_environment()), None)
    cache = _select.open_choice(chosen)
    url = chosen.target()  # with a settings file's cap, as compile applies it
    with cache:
        job = _Job(cache, args.warm_set, args.publish_every, profiles)
        other, here = _job_python(command, child_env(job_environment(), url, None, False), profiles)
        asked = other or here
        job.before(None if asked is None else asked.path, None if asked is None else asked.versions)
        try:
            env = child_env(job_environment(), url, job.journal, args.warm, chosen.secret_file)
            if other is not None and not other.cuforge:
                env["CUFORGE_RUN_QUIET"] = "1"  # said once above, not by every process
            proc = _start(command, env)
            job.start_publishing()
            rc = _wait(proc, job)
        finally:
            job.after()
        return rc


def _profiles() -> dict[str, Any]:
    """The mirror profiles (``mirror.configured_profiles``: the built-ins and the
    settings files' ``[mirror.<name>]`` tables, the set every entry point uses);
    UsageError naming the file and the key for a bad one, before the job starts."""
    from cuforge.integrations.mirror import configured_profiles

    try:
        return configured_profiles()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _job_python(
    command: list[str], env: dict[str, str], profiles: dict[str, Any]
) -> tuple[Any, Any]:
    """``(other, here)``: ``other``, the job's interpreter when the command starts
    another Python than this one (``_jobpython``): a ``JobPython`` whose ``path`` and
    ``versions`` the mirrors read, with an empty ``path`` (mirrors off) when it cannot
    be asked; what it means for the job is said in one line on stderr. ``here``:
    when the job runs this Python (or is no Python) and an active profile reads its
    version with ``version_from``, this Python asked as the job's would be (its
    ``sys.path`` with the script's directory or the working directory first), so the
    module is imported on the job's ``sys.path`` -- never in this process; else None.
    """
    from cuforge.cli import _jobpython
    from cuforge.integrations.mirror import active_profiles

    first = _jobpython.first_entry(command, env, os.getcwd())
    python = _jobpython.job_python(command, env)
    specs = tuple(sorted({p.version_from for p in active_profiles(env, profiles, path=[])
                          if p.version_from}))  # fmt: skip
    if python is None:
        if not specs:  # nothing to import: the mirrors read this Python (no probe)
            return None, None
        found = _jobpython.probe(sys.executable, env, first, specs)
        if isinstance(found, str):
            print(
                f"cuforge run: could not ask {sys.executable} for the versions of "
                f"{', '.join(specs)} ({found}); the mirrors that read them are off",
                file=sys.stderr,
            )
            return None, _jobpython.JobPython(sys.executable, list(sys.path), cuforge=True)
        return None, found
    found = _jobpython.probe(python, env, first, specs)
    if isinstance(found, str):
        print(
            f"cuforge run: could not ask {python} which packages it has ({found}); "
            "directory mirrors are off for this job",
            file=sys.stderr,
        )
        return _jobpython.JobPython(python, [], cuforge=True), None
    if not found.cuforge:
        print(
            f"cuforge run: {python} cannot import cuforge: Triton, Inductor, JAX and CuPy "
            "in this job are not wired to the cache (install cuforge in that environment); "
            "directory mirrors and the warm set still work, for the JITs installed there",
            file=sys.stderr,
        )
    return found, None


def _start(command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(command, env=env)
    except FileNotFoundError:
        raise UsageError(f"{command[0]}: command not found") from None
    except PermissionError:
        if os.sep in command[0] and os.path.isdir(command[0]):  # execve says EACCES
            raise UsageError(f"{command[0]}: is a directory, not a command") from None
        raise UsageError(f"{command[0]}: permission denied") from None
    except OSError as exc:
        raise UsageError(f"{command[0]}: cannot run it ({exc.strerror or exc})") from None


def _wait(proc: subprocess.Popen[bytes], job: _Job | None) -> int:
    """Wait for the job, passing signals on; its exit status, shell style."""
    previous: dict[int, Any] = {}

    def forward(signum: int, frame: object) -> None:
        if signum == signal.SIGINT and _terminal_delivered():
            return  # the terminal sent it to the job's process group too
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    for name in _FORWARDED:
        sig = getattr(signal, name, None)
        if sig is not None:
            with contextlib.suppress(ValueError, OSError):  # not the main thread
                previous[sig] = signal.signal(sig, forward)
    try:
        rc = proc.wait()
    finally:
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, handler)
    if job is not None:
        job.ended_ok = rc == 0
    return rc if rc >= 0 else 128 - rc


def _terminal_delivered() -> bool:
    """Whether a SIGINT came from the terminal: stdin is a terminal whose foreground
    process group is ours (the job is in it and got the signal too)."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


class _Job:
    """The parent's side: prefetch and hydrate before, publish periodically and after."""

    def __init__(
        self,
        cache: ProgramCacheResource,
        warm_set: str | None,
        every: float,
        profiles: dict[str, Any] | None = None,
    ) -> None:
        self.cache = cache
        self.profiles = profiles
        self.warm_set = warm_set
        self.every = every
        self.journal: str | None = None
        self.recorder: Any = None
        self.mirrors: list[Any] = []
        self.ended_ok = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def before(
        self, path: list[str] | None = None, imported: dict[str, str | None] | None = None
    ) -> None:
        """Prefetch the warm set and hydrate the mirrors; ``path``: the job's Python's
        ``sys.path`` when it was asked (the mirrors read its JITs), ``imported`` the
        ``version_from`` values read there (``_job_python``)."""
        from cuforge._log import get_logger
        from cuforge.integrations.sessions import each_mirror, open_mirrors, prefetch_set

        log = get_logger("cuforge.run")
        mirrored = self.cache
        if self.warm_set is not None:
            from cuforge.integrations.warmsets import Recorder

            self.journal = tempfile.mkdtemp(prefix="cuforge-run-")
            done = prefetch_set(self.cache, self.warm_set)
            if done is not None:
                log.info("warm set %r: %r", self.warm_set, done)
            # The mirrors' entries (hydrated, published, or already in place) join the set.
            self.recorder = mirrored = Recorder(
                self.cache, os.path.join(self.journal, "mirror.keys")
            )
        self.mirrors = open_mirrors(mirrored, path=path, profiles=self.profiles, imported=imported)
        each_mirror(self.mirrors, "hydrate")

    def start_publishing(self) -> None:
        self._thread = threading.Thread(target=self._periodic, name="cuforge-publish", daemon=True)
        self._thread.start()

    def _periodic(self) -> None:
        while not self._stop.wait(self.every):
            self.publish(final=False)

    def publish(self, final: bool) -> None:
        from cuforge.integrations import warmsets
        from cuforge.integrations.sessions import each_mirror

        with self._lock:
            each_mirror(self.mirrors, "publish")
            if self.warm_set is not None and self.journal is not None:
                keys = warmsets.read_journals(self.journal)
                if keys:  # a run that recorded nothing leaves the set as it was
                    replace = final and self.ended_ok
                    warmsets.publish(self.cache, self.warm_set, keys, replace=replace)
                elif final:  # said, so `cuforge warm --set NAME` finding none is no surprise
                    import warnings

                    from cuforge.storage.base import CacheWriteWarning

                    warnings.warn(
                        f"warm set {self.warm_set!r}: the job read or stored "
                        "nothing through the cache, so nothing was recorded (a set "
                        "stored before is left as it was)",
                        CacheWriteWarning,
                        stacklevel=2,
                    )

    def after(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.publish(final=True)
        finally:
            if self.recorder is not None:
                self.recorder.close()
            if self.journal is not None:
                shutil.rmtree(self.journal, ignore_errors=True)  # made by mkdtemp above
