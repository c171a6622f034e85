"""The architecture rules a tool can keep (docs/architecture.md, "Layers and seams").

import-linter keeps the layers, the backends' independence and acyclic packages
(``[tool.importlinter]`` in pyproject.toml, run by ``make lint``); these tests keep
the rest and prove that the linter really fails on a broken contract:

- no module imports a ``_private`` name or module of another package (a package
  shares what it chooses to under public names: its seams); the core modules
  (``cuforge._cuda``, ``_log``, ``_typing``, ``_lazy``, ``_hashing``, ``_native``)
  are shared by every layer;
- one concept per module: every module says which in its docstring's first line,
  and none is over 800 lines (a backstop, not a target: past it a module has so far
  always held two concepts; split by concept, never by the count);
- a cache's counters are storage's: no module outside ``cuforge.storage`` reads or
  writes ``._stats`` or counts through ``._tally*`` (``storage.failopen`` counts for
  a caller); a ``Program``'s private members are its own: outside
  ``compile/program.py`` the compile cache reads ``Program.source``, its seam;
- no import cycle among module-level imports anywhere in ``cuforge``.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "cuforge"
CORE = {
    "_archname", "_cuda", "_fields", "_hashing", "_lazy", "_log", "_names", "_native", "_stack",
    "_typing", "_warm",
}  # fmt: skip
MAX_LINES = 800


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, top_level_only: bool) -> list[tuple[int, str, str | None]]:
    """(line, module, imported name or None) of each cuforge import in ``path``;
    ``top_level_only``: what runs at import time (no function bodies, no
    ``if TYPE_CHECKING:`` blocks)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def walk(nodes: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            out.append(node)
            if isinstance(node, (ast.If, ast.Try, ast.With)):
                inner = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
                for handler in getattr(node, "handlers", []):
                    inner += handler.body
                out += walk(inner)
        return out

    nodes = walk(tree.body) if top_level_only else list(ast.walk(tree))
    found: list[tuple[int, str, str | None]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found += [(node.lineno, module, a.name) for a in node.names]
    return [f for f in found if f[1] == "cuforge" or f[1].startswith("cuforge.")]


def _package(name: str) -> str:
    """The layer package a module belongs to (``cuforge`` itself for top modules)."""
    parts = name.split(".")
    if len(parts) > 2 or (len(parts) == 2 and SRC.joinpath(parts[1]).is_dir()):
        return parts[1]
    return ""


def test_no_private_name_is_imported_across_packages() -> None:
    modules = _modules()
    bad = []
    for name, path in modules.items():
        mine = _package(name)
        for line, module, imported in _imports(name, path, top_level_only=False):
            parts = module.split(".")[1:]
            if imported is not None and f"{module}.{imported}" in modules:
                parts.append(imported)  # `from pkg import _module`
                imported = None
            if not parts or parts[0] == mine or parts[0] in CORE:
                continue
            private = [p for p in parts if p.startswith("_")]
            if imported is not None and imported.startswith("_"):
                private.append(imported)
            if private:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {module} {imported or ''}")
    assert not bad, "private names reached across packages (make them a seam):\n" + "\n".join(bad)


def test_each_module_names_its_concept_and_stays_small() -> None:
    unnamed, over = [], []
    for path in _modules().values():
        text = path.read_text()
        doc = ast.get_docstring(ast.parse(text))
        native_init = path.name == "__init__.py" and path.parent.name == "_native"
        if not native_init and (not doc or not doc.strip().splitlines()[0].strip()):
            unnamed.append(str(path.relative_to(ROOT)))
        if len(text.splitlines()) > MAX_LINES:
            over.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
    assert not unnamed, "say what each module is (a docstring):\n" + "\n".join(unnamed)
    assert not over, f"split these by concept (at most {MAX_LINES} lines):\n" + "\n".join(over)


#: Who may touch a cache's counters: storage, which owns them.
_COUNTERS = {"_stats", "_tally", "_tally_store", "_tally_failure"}


def _attribute_uses(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line, ``obj.attr``) of every attribute in ``names`` read or written on anything
    but ``self``/``cls`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in names:
            owner = node.value.id if isinstance(node.value, ast.Name) else ""
            if owner not in ("self", "cls"):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_only_storage_touches_a_caches_counters() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {use}"
        for name, path in _modules().items()
        if _package(name) != "storage"
        for line, use in _attribute_uses(path, _COUNTERS)
    ]
    assert not bad, "count through storage (storage.failopen):\n" + "\n".join(bad)


def _program_private_members() -> set[str]:
    """Every private member of ``Program``: methods and ``self._x`` it assigns."""
    tree = ast.parse((SRC / "compile" / "program.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Program"]
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    for node in ast.walk(cls):
        owner = node.value if isinstance(node, ast.Attribute) else None
        if isinstance(owner, ast.Name) and owner.id == "self":
            names.add(node.attr)  # type: ignore[attr-defined]
    # and what it held before the seam: nothing may reach for them again
    names |= {"_code", "_code_type", "_options", "_closed", "_compile_uncached"}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_a_programs_private_members_are_its_own() -> None:
    private = _program_private_members()
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {use}"
        for path in _modules().values()
        if path != SRC / "compile" / "program.py"
        for line, use in _attribute_uses(path, private)
        if use.split(".")[0].lstrip("(").lower().endswith(("program", "prog", "src"))
    ]
    assert not bad, "read a Program through Program.source:\n" + "\n".join(bad)


def test_no_import_cycle_among_module_level_imports() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for _, module, imported in _imports(name, path, top_level_only=True):
            target = f"{module}.{imported}" if f"{module}.{imported}" in modules else module
            if target in modules and target != name:
                graph[name].add(target)
    # Tarjan's strongly connected components; any with two or more modules is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not cycles, f"module-level import cycles: {cycles}"


def _lint_imports(cwd: Path, src: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter comes with the test extras (pip install -e '.[test]')")
    env = {"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(src)}
    return subprocess.run(
        [exe, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_import_contracts_hold() -> None:
    done = _lint_imports(ROOT, SRC.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_broken_contract_fails_the_linter(tmp_path: Path) -> None:
    """A backend importing another one fails ``lint-imports`` (and so ``make lint``)."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(SRC, tmp_path / "src" / "cuforge", ignore=shutil.ignore_patterns("*.so"))
    victim = tmp_path / "src" / "cuforge" / "storage" / "sqlite" / "_url.py"
    victim.write_text(victim.read_text() + "\nfrom cuforge.storage import redis  # deliberate\n")
    done = _lint_imports(tmp_path, tmp_path / "src")
    assert done.returncode != 0
    assert "storage backends are independent: none imports another BROKEN" in done.stdout
    assert "cuforge.storage.sqlite._url -> cuforge.storage.redis" in done.stdout
