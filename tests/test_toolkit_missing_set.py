"""A header set missing in auto mode is kept by the identity store (``_toolkit`` with
``_search_witnesses``): a later process is served the answer without searching, and
the set appearing anywhere the search looks -- its wheel, a file in the existing
``nvidia/`` namespace directory, ``$CUDA_HOME``, a toolkit the system loader finds
``libcudart`` in -- makes the next process search again and find it.

Real processes of a private virtual environment that has every package of this one
except the CCCL header wheel (symlinked, so it builds in a moment). The system loader
is pointed (``LD_LIBRARY_PATH``) at a toolkit with no headers that holds the runtime
wheel's libcudart, so a toolkit the host has installed does not supply CCCL."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from _cli import isolated_env
from cuforge.compile.cache import _identity_store

_PROBE = """
import json, sys
from cuforge.compile.cache import _toolkit
identity = _toolkit.toolkit_identity()
state = _toolkit._state
print(json.dumps({
    "identity": identity.hex(),
    "searched": state is not None,
    "pathfinder": "cuda.pathfinder" in sys.modules,
    "missing": None if state is None else list(state[0].missing),
    "found_via": None if state is None else {s.name: s.source for s in state[0].sets},
}))
"""

_HIDDEN = ("nvidia", "cu13", "include", "cccl")


def _site_packages() -> pathlib.Path:
    import cuda.pathfinder

    return pathlib.Path(cuda.pathfinder.__file__).resolve().parents[2]


def _mirror(real: pathlib.Path, into: pathlib.Path, hidden: tuple[str, ...]) -> None:
    """``into`` lists what ``real`` does, by symlink, except the path ``hidden``."""
    for item in real.iterdir():
        if item.name == hidden[0] and len(hidden) > 1 and item.is_dir():
            (into / item.name).mkdir()
            _mirror(item, into / item.name, hidden[1:])
        elif item.name != hidden[0] or len(hidden) > 1:
            (into / item.name).symlink_to(item)


def _cudart() -> pathlib.Path:
    return _site_packages() / "nvidia" / "cu13" / "lib" / "libcudart.so.13"


def _toolkit_without_headers(root: pathlib.Path) -> pathlib.Path:
    """A toolkit root whose lib64/ has libcudart and whose include/ is empty."""
    (root / "lib64").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "lib64" / "libcudart.so.13").symlink_to(_cudart())
    return root


@pytest.fixture
def venv(tmp_path):
    """(python, site-packages) of an environment with no CCCL header wheel."""
    real = _site_packages()
    if sys.platform != "linux":
        pytest.skip("the glibc loader's search (LD_LIBRARY_PATH)")
    if not (real.joinpath(*_HIDDEN) / "cuda" / "std" / "version").is_file():
        pytest.skip("needs the CUDA 13 CCCL header wheel (nvidia/cu13/include/cccl)")
    if not _cudart().is_file():
        pytest.skip("needs libcudart.so.13 from the CUDA 13 runtime wheel")
    _toolkit_without_headers(tmp_path / "decoy")
    root = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    (site,) = root.glob("lib/python*/site-packages")
    for item in real.iterdir():
        if item.name.lower().startswith("nvidia_cuda_cccl-"):
            continue  # the wheel's record: not installed here
        if item.name == "nvidia":
            (site / "nvidia").mkdir()
            _mirror(item, site / "nvidia", _HIDDEN[1:])
        else:
            (site / item.name).symlink_to(item)
    (tmp_path / "work").mkdir()
    return root / "bin" / "python", site


def _settle() -> None:
    """Everything just made is older than the store's racy window (ctime cannot be set back)."""
    time.sleep(_identity_store.RACY_NS / 1e9 + 0.3)


def _env(tmp_path: pathlib.Path, *lib_dirs: pathlib.Path, **extra: str) -> dict[str, str]:
    """The run's environment: no toolkit variables but ``extra``; the loader looks in
    ``lib_dirs``, then the decoy toolkit."""
    env = isolated_env(tmp_path, **extra)
    for name in ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX"):
        if name not in extra:
            env.pop(name, None)
    dirs = [*lib_dirs, tmp_path / "decoy" / "lib64"]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(map(str, dirs))
    return env


def _process(python: pathlib.Path, tmp_path: pathlib.Path, env: dict[str, str]) -> dict:
    done = subprocess.run([str(python), "-c", _PROBE], cwd=tmp_path / "work", env=env,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _served_until_it_appears(python, tmp_path, env, appear) -> dict:
    first = _process(python, tmp_path, env)
    assert first["searched"] and first["missing"] == ["cccl"], first
    assert list((tmp_path / "state" / "identity").glob("toolkit-headers-*")), "not recorded"
    second = _process(python, tmp_path, env)
    assert not second["searched"] and not second["pathfinder"], second
    assert second["identity"] == first["identity"]
    appear()
    third = _process(python, tmp_path, env)
    assert third["searched"] and third["missing"] == [], third
    assert third["identity"] != first["identity"]
    return third


@pytest.mark.parametrize("how", ["wheel", "namespace"])
def test_a_missing_set_is_kept_until_its_files_appear_in_site_packages(tmp_path, venv, how):
    """``wheel``: the wheel's record and headers appear (what pip installs);
    ``namespace``: only the headers, in the ``nvidia/`` directory that already
    existed -- the site-packages listing does not change, the searched path does."""
    python, site = venv
    env = _env(tmp_path)
    _settle()
    real = _site_packages()

    def appear() -> None:
        site.joinpath(*_HIDDEN).symlink_to(real.joinpath(*_HIDDEN))
        if how == "wheel":
            (dist,) = real.glob("nvidia_cuda_cccl-*.dist-info")
            (site / dist.name).symlink_to(dist)

    third = _served_until_it_appears(python, tmp_path, env, appear)
    if how == "wheel":
        assert third["found_via"]["cccl"] == "wheel"
        here = _process(pathlib.Path(sys.executable), tmp_path, _env(tmp_path))
        assert third["identity"] == here["identity"]  # the same headers as this environment
    else:
        assert third["found_via"]["cccl"] == "site-packages"


def test_a_missing_set_is_kept_until_it_appears_under_cuda_home(tmp_path, venv):
    python, _ = venv
    home = tmp_path / "cuda-home"
    (home / "include").mkdir(parents=True)
    env = _env(tmp_path, CUDA_HOME=str(home))
    _settle()

    def appear() -> None:
        (home / "include" / "cccl").symlink_to(_site_packages().joinpath(*_HIDDEN))

    third = _served_until_it_appears(python, tmp_path, env, appear)
    assert third["found_via"]["cccl"] == "CUDA_PATH"


@pytest.mark.parametrize("how", ["library", "headers"])
def test_a_missing_set_is_kept_until_the_loader_finds_a_toolkit_that_has_it(tmp_path, venv, how):
    """cuda.pathfinder's last resort loads libcudart with the system loader and looks
    beside it. ``library``: a libcudart appears earlier on ``LD_LIBRARY_PATH``, in a
    toolkit whose include directory has CCCL; ``headers``: CCCL appears in the
    toolkit whose libcudart the loader found."""
    python, _ = venv
    earlier = tmp_path / "toolkit"
    (earlier / "lib64").mkdir(parents=True)
    (earlier / "include").mkdir()
    cccl = _site_packages().joinpath(*_HIDDEN)
    if how == "library":
        (earlier / "include" / "cccl").symlink_to(cccl)
        env = _env(tmp_path, earlier / "lib64")
    else:
        env = _env(tmp_path)
    _settle()

    def appear() -> None:
        if how == "library":
            (earlier / "lib64" / "libcudart.so.13").symlink_to(_cudart())
        else:
            (tmp_path / "decoy" / "include" / "cccl").symlink_to(cccl)

    third = _served_until_it_appears(python, tmp_path, env, appear)
    assert third["found_via"]["cccl"] == "system-ctk-root"
