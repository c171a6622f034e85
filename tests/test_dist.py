"""The wheel installs anywhere: ``make dist`` builds it, a fresh venv outside the
source tree installs it with no C compiler and no source builds, and what ``make
demo`` runs works there from the installed package. A module, package file or data
file missing from the wheel fails here.

Marked ``dist`` (and ``slow``): ``make test-dist`` and CI run it, ``make test`` does
not. Needs the package index (or pip's cache) for the wheel's dependencies.
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "cuforge"
VERSION = re.search(r'^__version__ = "([^"]+)"', (SRC / "__init__.py").read_text(), re.M)[1]


def _make(*args: str, python: str = sys.executable, venv: str = sys.prefix):
    """``make`` in the source tree with ``venv`` as the Makefile's (taken as
    installed, so make neither creates nor reinstalls it)."""
    return subprocess.run(
        ["make", "-s", "-C", str(ROOT), f"PY={python}", f"VENV={venv}",
         "-o", f"{venv}/.installed", *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def dist() -> tuple[Path, Path]:
    done = _make("dist")
    assert done.returncode == 0, done.stdout + done.stderr
    wheels = list((ROOT / "dist").glob("cuforge-*.whl"))
    sdists = list((ROOT / "dist").glob("cuforge-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, os.listdir(ROOT / "dist")
    return wheels[0], sdists[0]


def test_an_sdist_and_a_manylinux_wheel_with_everything_in_them(dist):
    wheel, sdist = dist
    name, version, python, abi, platforms = wheel.name.removesuffix(".whl").split("-")
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert (name, version) == ("cuforge", VERSION) and python == abi == tag
    # glibc 2.17 or newer on x86-64: every Linux that CUDA 12 and 13 support.
    assert set(platforms.split(".")) == {"manylinux_2_17_x86_64", "manylinux2014_x86_64"}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = email.parser.Parser().parsestr(
            z.read(f"cuforge-{VERSION}.dist-info/METADATA").decode()
        )
    # Every module of the package, and every C helper compiled (no sources): each
    # src/cuforge/_native/<name>.c is the extension cuforge._native._<name> (setup.py).
    modules = {str(p.relative_to(SRC.parent)) for p in SRC.rglob("*.py")}
    assert modules <= names, sorted(modules - names)
    helpers = {f"cuforge/_native/_{c.stem}" for c in (SRC / "_native").glob("*.c")}
    assert len(helpers) >= 4  # launch, release, graph, guard at least
    native = {n for n in names if n.startswith("cuforge/_native/")}
    assert {n.split(".")[0] for n in native if n.endswith(".so")} == helpers
    assert not any(n.endswith((".c", ".h")) for n in names)
    assert f"cuforge-{VERSION}.dist-info/licenses/LICENSE" in names
    # One version source; complete metadata.
    assert meta["Version"] == VERSION and meta["Requires-Python"] == ">=3.10"
    assert meta["License-Expression"] == "Apache-2.0"
    assert {"cu12", "cu13", "redis", "test"} <= set(meta.get_all("Provides-Extra"))
    classifiers = set(meta.get_all("Classifier"))
    for c in (
        "Environment :: GPU :: NVIDIA CUDA :: 12",
        "Environment :: GPU :: NVIDIA CUDA :: 13",
        "Programming Language :: Python :: 3.10",
        "Operating System :: POSIX :: Linux",
    ):
        assert c in classifiers, c
    requires = meta.get_all("Requires-Dist")
    assert any(r.startswith("nvidia-cuda-nvrtc-cu12") and 'extra == "cu12"' in r for r in requires)
    assert not any(r.startswith("nvidia-") and "extra" not in r for r in requires)
    with tarfile.open(sdist) as t:
        members = {m.name.split("/", 1)[1] for m in t.getmembers() if "/" in m.name}
    for needed in ("CHANGELOG.md", "LICENSE", "setup.py", "src/cuforge/_native/release.c",
                   "src/cuforge/_native/glibc_compat.h", "docs/compile.md"):  # fmt: skip
        assert needed in members, needed


def test_the_wheel_installs_without_a_compiler_and_runs_the_demo_outside_the_tree(dist, tmp_path):
    wheel, _ = dist
    assert not tmp_path.resolve().is_relative_to(ROOT)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    # No compiler reachable: only the venv's own tools on PATH, CC and CXX refuse, and
    # pip may install wheels only (it would need a compiler for anything else).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=str(venv / "bin"), CC="/bin/false", CXX="/bin/false")
    assert shutil.which("gcc", path=env["PATH"]) is None
    assert shutil.which("cc", path=env["PATH"]) is None
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--only-binary=:all:", f"{wheel}[cu13]"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr

    probe = subprocess.run(
        [python, "-c", "import cuforge, importlib.metadata as m, cuforge._native._release, "
         "cuforge._native._launch; print(cuforge.__file__); print(m.version('cuforge'))"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    where, version = probe.stdout.split()
    assert Path(where).resolve().is_relative_to(venv.resolve()) and version == VERSION
    cli = subprocess.run(
        [str(venv / "bin" / "cuforge"), "--help"], capture_output=True, text=True, env=env
    )
    assert cli.returncode == 0, cli.stderr

    # What `make demo` runs, with the fresh venv's python, in a directory holding
    # only the example inputs: cuforge itself comes from the installed wheel.
    recipe = _make("-n", "demo", python=python, venv=str(venv))
    assert recipe.returncode == 0, recipe.stderr
    commands = [line for line in recipe.stdout.splitlines() if line.strip()]
    assert commands and all(str(venv) in c for c in commands), commands
    work = tmp_path / "demo"
    shutil.copytree(ROOT / "examples", work / "examples")
    for command in commands:
        run = subprocess.run(
            ["/bin/sh", "-c", command], capture_output=True, text=True, env=env, cwd=work,
            timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, f"{command}\n{run.stdout}\n{run.stderr}"
        assert run.stdout.strip(), command
