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
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping

__all__ = ["JobPython", "job_python", "probe"]

_PYTHON = re.compile(r"python(\d+(\.\d+)*t?)?")
_PROBE = (
    "import importlib.util, json, sys\n"
    "print(json.dumps({'path': [p for p in sys.path if p],"
    " 'cuforge': importlib.util.find_spec('cuforge') is not None}))\n"
)
_PROBE_TIMEOUT_S = 60.0


class JobPython:
    """What the job's interpreter said: its ``sys.path`` and whether it has cuforge."""

    __slots__ = ("cuforge", "executable", "path")

    def __init__(self, executable: str, path: list[str], cuforge: bool) -> None:
        self.executable, self.path, self.cuforge = executable, path, cuforge


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


def probe(python: str, env: Mapping[str, str]) -> JobPython | str:
    """Ask ``python`` (in the job's environment, without cuforge's start-up hook) for
    its ``sys.path`` and whether it can import cuforge; why not, when it cannot be
    asked (one phrase)."""
    quiet = {k: v for k, v in env.items() if k != "CUFORGE_RUN"}  # the hook stays idle
    try:
        done = subprocess.run(
            [python, "-c", _PROBE], env=quiet, capture_output=True, timeout=_PROBE_TIMEOUT_S
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
        return JobPython(python, path, bool(said["cuforge"]))
    except (ValueError, KeyError, IndexError, TypeError):
        return "its answer could not be read"
