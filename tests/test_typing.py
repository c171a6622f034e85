"""cuforge is typed for its users: a type checker sees the real public names (not the
``Any`` a lazy ``__getattr__`` would give) and flags misuse of the API, bytes-like
parameters included.

``make lint`` runs ``mypy --strict`` on ``src/``; these tests run mypy the way a user's
project would, on small snippets that import the installed package (py.typed).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "cuforge"

pytest.importorskip("mypy", reason="mypy comes with the test extras (pip install -e '.[test]')")

# Each line marked "# E: code" must get exactly that error; unmarked lines none.
MISUSE = """
import cuforge
from cuforge import LaunchConfig, ObjectCode, Program, ProgramOptions
from cuforge.graph import GraphDefinition
from cuforge.utils import InMemoryProgramCache, make_program_cache_key, open_cache

not_a_class: int = cuforge.Program  # E: assignment
ObjectCode(12345, "cubin")  # E: arg-type
Program(b"__global__ void k() {}", "c++", options="sm_90")  # E: arg-type
LaunchConfig(grid="1", block=32)  # E: arg-type
cuforge.Device("0")  # E: arg-type
GraphDefinition().memset(0, 3.5, 4)  # E: arg-type
GraphDefinition().callback(print, user_data="text")  # E: arg-type
cache = InMemoryProgramCache()
cache[b"key"] = 42  # E: assignment
cache.get(b"key", default=3)  # E: arg-type
open_cache(42)  # E: arg-type
make_program_cache_key(code=42, code_type="c++", options=ProgramOptions(arch="sm_90"), target_type="cubin")  # E: arg-type
"""  # noqa: E501

# The same API used as documented: no error at all.
PROPER_USE = """
import array

import cuforge
from cuforge import LaunchConfig, ObjectCode, Program, ProgramOptions
from cuforge.graph import GraphDefinition
from cuforge.utils import InMemoryProgramCache, make_program_cache_key


def build(cache: InMemoryProgramCache) -> bytes:
    options = ProgramOptions(arch="sm_90", define_macro=["N=4"])
    obj = Program("__global__ void k() {}", "c++", options).compile("cubin", cache=cache)
    cache[b"a"] = obj
    cache[b"b"] = bytearray(b"raw")
    cache[b"c"] = memoryview(b"raw")
    key = make_program_cache_key(
        code="__global__ void k() {}", code_type="c++", options=options, target_type="cubin"
    )
    entry = cache.get(key)
    return obj.code + (entry or b"")


def graph(buf: cuforge.Buffer) -> None:
    g = GraphDefinition()
    g.memset(buf, b"\\x01\\x02", 8).memset(buf, array.array("B", [7]), 16)
    g.callback(print).callback(print, user_data=None)
    g.instantiate().launch(cuforge.Device(0).create_stream())


ObjectCode(b"\\x7fELF", "cubin", name="k")
LaunchConfig(grid=(4, 2), block=128, shmem_size=0)
"""


def _mypy(tmp_path: Path, name: str, code: str) -> list[tuple[int, str]]:
    """(line, error code) for every error mypy --strict reports in ``code``."""
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--show-error-codes",
         "--cache-dir", str(tmp_path / "cache"), "--config-file", str(tmp_path / "none.ini"),
         path.name],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    error = rf"^{re.escape(path.name)}:(\d+): error: .*\[([a-z-]+)\]$"
    found = re.findall(error, done.stdout, re.M)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return [(int(line), code) for line, code in found]


def test_misuse_of_the_public_api_is_flagged(tmp_path):
    (tmp_path / "none.ini").write_text("[mypy]\n")
    expected = [
        (i, m[1])
        for i, line in enumerate(MISUSE.splitlines(), 1)
        if (m := re.search(r"# E: ([a-z-]+)", line))
    ]
    assert len(expected) == 11
    assert _mypy(tmp_path, "misuse", MISUSE) == expected


def test_documented_use_type_checks_clean(tmp_path):
    (tmp_path / "none.ini").write_text("[mypy]\n")
    assert _mypy(tmp_path, "proper", PROPER_USE) == []


def _checked_exports(init: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(_EXPORTS as the package resolves it at run time, what its ``if TYPE_CHECKING:``
    block imports): name -> defining module, both."""
    tree = ast.parse(init.read_text())
    exports: dict[str, str] = {}
    typed: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id == "_EXPORTS":
                exports = ast.literal_eval(node.value)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module.startswith("cuforge"):
                    for alias in stmt.names:
                        assert alias.asname == alias.name, "re-export as `X as X`"
                        typed[alias.name] = stmt.module
    return exports, typed


@pytest.mark.parametrize(
    "init",
    ["__init__.py", "utils.py", "compile/__init__.py", "storage/__init__.py"],
)
def test_lazy_exports_are_spelled_out_for_type_checkers(init):
    exports, typed = _checked_exports(SRC / init)
    assert exports and exports == typed
