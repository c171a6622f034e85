"""The job's Python, when ``cuforge run`` starts another interpreter than its own
(``cuforge run -- /other/venv/bin/python train.py``).

Two things depend on it. The directory mirrors key their entries by the JIT's
version and hydrate only for JITs that are installed: both must be read in the
job's Python, not in cuforge's (whose Warp, Numba or torch may be another version,
or absent). And the job's processes wire their JITs through cuforge's start-up hook,
which imports the ``cuforge`` installed in *their* environment: where there is none,
nothing is wired.

So when the command's first word is a Python interpreter (``python``, ``python3.12``,
a path to one; found on the job's ``PATH``) other than the one running ``cuforge
run``, it is asked once, before the job starts, for its ``sys.path`` and whether it
can import cuforge (:func:`probe`): the mirrors then read that ``sys.path``; a Python
without cuforge is said in one line (and the hook's own line in each process is
silenced); a Python that cannot be asked turns the mirrors off for the job, in one
line. A command that is not a Python (a shell script that starts one) is not looked
into: the mirrors read cuforge's own Python, as documented.

A profile's ``version_from`` (``module:attribute``, a JIT with no distribution: a
module in the project) is read by importing the module in the job's Python -- this
one too, when the command runs it, and cuforge's own Python for a command that is
not one -- never in ``cuforge run``'s process, whose ``sys.path`` lacks what the
job's puts first (:func:`first_entry`: the script's directory for ``python
script.py``, the working directory for ``-m``/``-c``). That costs one probe (the
module's import, bounded by the same timeout), only when a profile asks for it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping

__all__ = ["JobPython", "first_entry", "job_python", "probe"]

_PYTHON = re.compile(r"python(\d+(\.\d+)*t?)?")
_PROBE = (
    "import importlib, importlib.util, json, sys\n"
    "asked = json.loads(sys.argv[1])\n"
    "if sys.path[:1] == ['']: del sys.path[0]\n"
    "if asked['first'] is not None: sys.path.insert(0, asked['first'])\n"
    "def version(spec):\n"
    "    module, _, attr = spec.partition(':')\n"
    "    try:\n"
    "        value = getattr(importlib.import_module(module), attr)\n"
    "        value = value() if callable(value) else value\n"
    "    except BaseException:\n"
    "        return None\n"
    "    return module + '==' + value if isinstance(value, str) and value else None\n"
    "versions = {spec: version(spec) for spec in asked['specs']}\n"
    "print()\n"
    "print(json.dumps({'path': [p for p in sys.path if p], 'versions': versions,"
    " 'cuforge': importlib.util.find_spec('cuforge') is not None}))\n"
)
#: Options of the interpreter that take a value (``-W arg``, ``-X opt``).
_VALUED = frozenset("WX")
_PROBE_TIMEOUT_S = 60.0


class JobPython:
    """What the job's interpreter said: its ``sys.path`` and whether it has cuforge."""

    __slots__ = ("cuforge", "executable", "path", "versions")

    def __init__(
        self,
        executable: str,
        path: list[str],
        cuforge: bool,
        versions: dict[str, str | None] | None = None,
    ) -> None:
        self.executable, self.path, self.cuforge = executable, path, cuforge
        self.versions: dict[str, str | None] = versions or {}


def first_entry(command: list[str], env: Mapping[str, str], cwd: str) -> str | None:
    """What the Python that ``command`` starts puts first on its ``sys.path``: the
    script's directory (symbolic links resolved) for ``python script.py``, ``cwd``
    for ``-m``, ``-c``, ``-`` or no script; None with ``-I``, ``-P`` or
    ``$PYTHONSAFEPATH`` (nothing put there) or a command that is not a Python."""
    if not _PYTHON.fullmatch(os.path.basename(command[0])):
        return None
    if env.get("PYTHONSAFEPATH"):
        return None
    args, i = command[1:], 0
    while i < len(args):
        arg = args[i]
        if arg == "--":  # the end of the options: the script, if any, follows
            arg = args[i + 1] if i + 1 < len(args) else "-"
        if arg == "-":
            return cwd
        if not arg.startswith("-"):
            return os.path.dirname(os.path.realpath(os.path.join(cwd, arg)))
        if not arg.startswith("--"):  # --help, --version: no value, nothing run
            flags = arg[1:]
            for j, flag in enumerate(flags):
                if flag in "IP":
                    return None
                if flag in "cm":
                    return cwd
                if flag in _VALUED:
                    i += j == len(flags) - 1  # its value is the next word
                    break
        i += 1
    return cwd


def job_python(command: list[str], env: Mapping[str, str]) -> str | None:
    """The interpreter the job's command starts when its first word is a Python other
    than this one (by path), found on the job's ``PATH``; else None."""
    first = command[0]
    if not _PYTHON.fullmatch(os.path.basename(first)):
        return None
    if os.sep in first:
        found: str | None = first if os.access(first, os.X_OK) else None
    else:
        found = shutil.which(first, path=env.get("PATH", os.defpath))
    if found is None or os.path.abspath(found) == os.path.abspath(sys.executable):
        return None
    return found


def probe(
    python: str,
    env: Mapping[str, str],
    first: str | None = None,
    specs: tuple[str, ...] = (),
) -> JobPython | str:
    """Ask ``python`` (in the job's environment, without cuforge's start-up hook) for
    its ``sys.path`` -- with ``first`` put first, as the job's command does
    (:func:`first_entry`) -- whether it can import cuforge, and the value of each
    ``module:attribute`` of ``specs`` (``module==value``, or None when it fails to
    import or is no non-empty string: ``Profile.version``); why not, when it cannot
    be asked (one phrase)."""
    quiet = {k: v for k, v in env.items() if k != "CUFORGE_RUN"}  # the hook stays idle
    asked = json.dumps({"first": first, "specs": list(specs)})
    try:
        done = subprocess.run(
            [python, "-c", _PROBE, asked],
            env=quiet,
            capture_output=True,
            timeout=_PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"it did not answer within {_PROBE_TIMEOUT_S:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return f"exit status {done.returncode}: {tail[0][:200]}"
    try:
        said = json.loads(done.stdout.decode(errors="replace").strip().splitlines()[-1])
        path = [str(p) for p in said["path"]]
        versions = {str(k): (str(v) if v else None) for k, v in said["versions"].items()}
        return JobPython(python, path, bool(said["cuforge"]), versions)
    except (ValueError, KeyError, IndexError, TypeError):
        return "its answer could not be read"
