"""The README's Python example runs as written (on a GPU machine)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _example(index: int = 0) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert len(blocks) > index, f"README.md has no python example #{index}"
    return blocks[index]


def _example_with(text: str) -> str:
    """The one README python example that contains ``text``."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    found = [b for b in blocks if text in b]
    assert len(found) == 1, f"README.md has {len(found)} python examples with {text!r}"
    return found[0]


@pytest.mark.gpu
def test_readme_example_runs_and_its_kernel_doubles(tmp_path, monkeypatch):
    from cuda.bindings import driver

    from cuforge import LaunchConfig, Program, ProgramOptions, launch
    from cuforge.utils import FileStreamProgramCache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # keep the user's cache clean
    ns: dict = {}
    exec(compile(_example(), "README.md", "exec"), ns)
    assert ns["obj"].code[:4] == b"\x7fELF"

    # The example's kernel, run again on known data, doubles every element.
    buf, stream = ns["buf"], ns["stream"]
    values = np.arange(32, dtype=np.float32)
    stream.sync()
    assert driver.cuMemcpyHtoD(buf.handle, values.ctypes.data, values.nbytes)[0] == 0
    launch(stream, LaunchConfig(grid=1, block=32), ns["obj"].get_kernel("twice"), buf)
    stream.sync()
    out = np.empty_like(values)
    assert driver.cuMemcpyDtoH(out.ctypes.data, buf.handle, out.nbytes)[0] == 0
    assert np.array_equal(out, values * 2)

    # Running the example again is a cache hit in the same default directory.
    with FileStreamProgramCache() as cache:
        Program(ns["src"], "c++", ProgramOptions(arch="sm_90")).compile("cubin", cache=cache)
        assert cache.stats().hits == 1 and cache.stats().misses == 0


@pytest.mark.gpu
def test_readme_graph_example_runs_after_the_buffer_is_closed(tmp_path, monkeypatch):
    from cuda.bindings import driver

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ns: dict = {}
    exec(compile(_example(0), "README.md", "exec"), ns)
    values = np.arange(32, dtype=np.float32)
    ns["stream"].sync()
    assert driver.cuMemcpyHtoD(ns["buf"].handle, values.ctypes.data, values.nbytes)[0] == 0
    exec(compile(_example_with("from cuforge.graph import"), "README.md", "exec"), ns)
    assert ns["buf"].is_closed
    out = np.empty_like(values)
    assert driver.cuMemcpyDtoH(out.ctypes.data, ns["out"].handle, out.nbytes)[0] == 0
    assert np.array_equal(out, values * 2)  # the closed buffer's memory was still valid
    ns["exe"].close()


def test_the_quick_start_says_what_make_test_runs():
    """The README said ``make test`` "runs ruff and the test suite": it runs ``make
    lint`` (ruff, mypy, import-linter) and may install redis-server first."""
    makefile = (README.parent / "Makefile").read_text()
    prerequisites = re.search(r"^test: (.*)$", makefile, re.M)[1].split()
    lint = re.search(r"^lint: .*\n((?:\t.*\n)+)", makefile, re.M)[1]
    (line,) = [x for x in README.read_text().splitlines() if x.startswith("make test ")]
    assert {"lint", "redis-server"} <= set(prerequisites)
    assert "redis-server" in line
    for command, name in (("ruff", "ruff"), ("mypy", "mypy"), ("lint-imports", "import-linter")):
        assert command in lint and name in line, name
