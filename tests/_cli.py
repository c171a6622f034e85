"""Running the real ``cuforge`` console script in a subprocess, isolated from the
user's caches: every run gets its own user cache directory (``XDG_CACHE_HOME``),
state directory and no inherited ``CUFORGE_*`` settings unless a test sets them."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SAXPY = EXAMPLES / "saxpy.cu"
SCRIPT = pathlib.Path(sys.executable).with_name("cuforge")


def isolated_env(home: pathlib.Path, **extra: str) -> dict[str, str]:
    """The environment of a run whose caches all live under ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
    env.update(XDG_CACHE_HOME=str(home / "xdg"), CUFORGE_STATE_DIR=str(home / "state"))
    env.pop("NO_COLOR", None)
    env.update(extra)
    return env


def no_aws_env(home: pathlib.Path, **extra: str) -> dict[str, str]:
    """:func:`isolated_env` without AWS credentials or profiles -- but with the loopback
    instance-metadata address conftest sets, so a credential lookup stays on loopback."""
    env = {
        k: v
        for k, v in isolated_env(home).items()
        if not k.startswith("AWS_") or k == "AWS_METADATA_ENDPOINT"
    }
    env.update(extra)
    return env


def run(
    home: pathlib.Path,
    *args: str,
    cwd: pathlib.Path | None = None,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``cuforge ARGS`` through the installed console script."""
    assert SCRIPT.exists(), f"the console script is not installed at {SCRIPT}"
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env if env is not None else isolated_env(home),
        input=stdin,
        timeout=240,
    )


def one_line_error(result: subprocess.CompletedProcess[str], prog: str) -> str:
    """The single stderr line of a usage error (exit 2), checked to be one."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    assert "Traceback" not in result.stderr
    return lines[0]


def read_only_run(cache: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``cuforge ARGS`` with ``cache`` a read-only bind mount of itself, in a mount
    namespace of its own (gone with the process); skipped where mounts cannot be made."""
    import shutil

    import pytest

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to make a private read-only mount")
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" || exit 99; shift; exec "$@"'
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", str(cache), str(SCRIPT), *args],
        capture_output=True, text=True, env=isolated_env(cache.parent), timeout=240,
    )  # fmt: skip
    if result.returncode == 99 or "unshare: " in result.stderr:
        pytest.skip(f"no read-only bind mount here: {result.stderr.strip()}")
    return result


def shown_size(home: pathlib.Path, url: str) -> str:
    """The entries' bytes of the cache ``url`` names, as the summaries print them (they
    depend on the compiler: a CUDA 12 cubin is smaller than a CUDA 13 one)."""
    import json

    from cuforge.storage.units import format_size

    result = run(home, "cache", "ls", "--json", "--cache", url)
    assert result.returncode == 0, result.stderr
    return format_size(sum(e["size"] for e in json.loads(result.stdout)))
