"""``pip install cuforge`` without the compiler extras (``[cu13]``/``[cu12]``): the
command line says in one line which extra to install, exit 2 -- it printed a
40-line traceback ending in the ``ToolkitNotFoundError`` that said so.

A real install, once per session: a fresh venv (outside the source tree) holding
cuforge -- built from a copy of the sources, as ``pip install .`` would -- and its
required dependencies only (cuda-bindings, cuda-pathfinder, platformdirs, at the
versions this venv has, so pip takes them from its cache), no NVIDIA wheel. About
5 s; skipped where pip cannot install them, or where a CUDA toolkit cuda.pathfinder
finds (``$CUDA_HOME``, conda, the system) supplies NVRTC anyway.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _cli import ROOT, SAXPY, isolated_env, one_line_error
from reliability._figures import record

pytestmark = pytest.mark.slow

_REQUIRED = ["cuda-bindings", "cuda-pathfinder", "platformdirs"]
if sys.version_info < (3, 11):
    _REQUIRED.append("tomli")
_TREE = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "MANIFEST.in")


@pytest.fixture(scope="session")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` directory of a venv with cuforge and no compiler extra."""
    home = tmp_path_factory.mktemp("bare")
    source = home / "source"  # pip builds here, never in the checkout
    source.mkdir()
    for name in _TREE:
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "src", source / "src",
        ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info"),
    )  # fmt: skip
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in _REQUIRED]
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "-q", "--no-deps", *pins, str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if install.returncode != 0:
        pytest.skip(f"pip could not install cuforge's dependencies here: {install.stderr[-500:]}")
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.metadata as m; print(*sorted(d.name for d in m.distributions()))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert not [n for n in listed if n.startswith("nvidia")], listed
    found = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "from cuda.pathfinder import load_nvidia_dynamic_lib as f; f('nvrtc')"],
        capture_output=True, env=_env(home),
    )  # fmt: skip
    if found.returncode == 0:
        pytest.skip("a CUDA toolkit outside the venv supplies NVRTC here")
    return venv / "bin"


def _env(home: Path) -> dict[str, str]:
    env = isolated_env(home)
    for name in ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX", "LD_LIBRARY_PATH", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env


def test_compile_and_warm_without_the_compiler_extra_say_which_to_install(bare, tmp_path):
    shutil.copy(SAXPY, tmp_path / "saxpy.cu")
    (tmp_path / "warm.toml").write_text('[[kernel]]\nsource = "saxpy.cu"\narch = "sm_90"\n')
    major = importlib.metadata.version("cuda-bindings").split(".")[0]
    commands = [
        ("compile", "saxpy.cu", "--arch", "sm_90"),  # compiled in this process
        ("compile", "saxpy.cu", "--arch", "sm_80,sm_90"),  # in worker processes
        ("compile", "saxpy.cu", "--arch", "sm_90", "--no-cache"),
        ("warm", "warm.toml"),
    ]
    for args in commands:
        result = subprocess.run(
            [str(bare / "cuforge"), *args],
            capture_output=True, text=True, cwd=tmp_path, env=_env(tmp_path), timeout=240,
        )  # fmt: skip
        line = one_line_error(result, f"cuforge {args[0]}")
        assert "no NVRTC library" in line, line
        assert f"pip install 'cuforge[cu{major}]'" in line, line
        assert result.stdout == "", args
    assert not list(tmp_path.glob("*.cubin"))
    record(
        "inputs", "cli",
        "a plain pip install (cuda-bindings, cuda-pathfinder, platformdirs; no compiler "
        "extra): compile for one arch, for two in worker processes, with --no-cache; warm",
        len(commands),
        "every one: exit 2, one line naming the extra to install (pip install "
        "'cuforge[cu13]'), no traceback, no output", scale="all",
    )  # fmt: skip
