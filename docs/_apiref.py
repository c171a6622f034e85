"""Sphinx extension for cuforge's API reference: public names, one page each, no gaps.

cuforge's public objects live in private modules (``cuforge.storage.filestream``)
and are exported, often by several packages at once (``cuforge.utils`` and
``cuforge.storage`` both export ``FileStreamProgramCache``). The API pages document
each object once, under its most prominent public name. This extension:

- resolves any reference to a public object -- by a public name, by its defining
  module's path (as signatures spell annotations) or by a short name that exactly
  one documented object ends with -- to the page that documents it;
- follows names a module imports for type checkers only (``if TYPE_CHECKING:``,
  e.g. ``cuforge._typing``'s annotation types, documented on the types page) to what
  they name;
- renders a reference to something real but not public (a private helper, a
  standard-library or redis-py type) as plain text, without a link;
- leaves a reference to something that does not exist unresolved, so the strict
  build (``-n -W``) fails on it;
- fails the build when a public name (in ``__all__`` of a module in ``PUBLIC``, not
  starting with ``_``) is documented on no page;
- adds the ``publicnames`` directive: every public name of a module, each linked
  to where it is documented.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import sys
from typing import Any

from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import make_refnode

#: The public modules, most prominent first (the order names are looked up in).
PUBLIC = (
    "cuforge",
    "cuforge.utils",
    "cuforge.graph",
    "cuforge.compile",
    "cuforge.runtime",
    "cuforge.storage",
)

logger = logging.getLogger(__name__)
_MISSING = object()


def public_names(module: str) -> list[str]:
    """The names ``module`` exports (its ``__all__``), private ones left out."""
    return [n for n in importlib.import_module(module).__all__ if not n.startswith("_")]


def _lookup(dotted: str) -> Any:
    """The object a dotted path names (longest importable module, then attributes)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        if name not in sys.modules:
            if parts[0] != "cuforge":  # other packages only when already loaded
                continue
            try:
                importlib.import_module(name)
            except Exception:  # not a module (or one that cannot import here)
                continue
        obj: Any = sys.modules[name]
        for attr in parts[cut:]:
            obj = getattr(obj, attr, _MISSING)
            if obj is _MISSING:
                return _MISSING
        return obj
    return getattr(builtins, dotted, _MISSING)


def _has_identity(obj: Any) -> bool:
    """Whether ``obj`` is told apart by identity (a class, function or module; not an
    int or string that other names may share)."""
    return inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)


class _Index:
    """Documented Python objects by identity, rebuilt when the set changes."""

    def __init__(self) -> None:
        self.size = -1
        self.by_id: dict[int, str] = {}

    def get(self, objects: dict[str, Any]) -> dict[int, str]:
        if len(objects) != self.size:
            self.by_id = {}
            for name in sorted(objects, key=len):  # shortest name wins
                obj = _lookup(name)
                if obj is not _MISSING and _has_identity(obj):
                    self.by_id.setdefault(id(obj), name)
            self.size = len(objects)
        return self.by_id


_INDEX = _Index()


def _canonical(dotted: str, objects: dict[str, Any]) -> str | None:
    """The documented name of the object ``dotted`` names (or of an attribute path
    below a documented object), or None."""
    by_id = _INDEX.get(objects)
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        obj = _lookup(".".join(parts[:cut]))
        if obj is _MISSING or not _has_identity(obj) or id(obj) not in by_id:
            continue
        name = ".".join([by_id[id(obj)], *parts[cut:]])
        if name in objects:
            return name
    return None


@functools.cache
def _checker_imports(module: str) -> dict[str, str]:
    """Names ``module`` imports inside ``if TYPE_CHECKING:`` blocks (what a type
    checker sees, absent at run time), mapped to the dotted names they import."""
    source = getattr(sys.modules.get(module), "__file__", None)
    if not source or not source.endswith(".py"):
        return {}
    with open(source, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found: dict[str, str] = {}
    for block in ast.walk(tree):
        if not (isinstance(block, ast.If) and isinstance(block.test, ast.Name)):
            continue
        if block.test.id != "TYPE_CHECKING":
            continue
        for stmt in block.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                for alias in stmt.names:
                    found[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
    return found


def _contexts(node: pending_xref) -> list[str]:
    """Modules a short name in ``node`` may come from: the page's module, the module
    that defines the class being documented, then every loaded cuforge module."""
    out = []
    module, cls = node.get("py:module"), node.get("py:class")
    if module:
        out.append(module)
        if cls:
            owner = _lookup(f"{module}.{cls}")
            if owner is not _MISSING and getattr(owner, "__module__", None):
                out.append(owner.__module__)
    out += sorted(m for m in list(sys.modules) if m == "cuforge" or m.startswith("cuforge."))
    return out


def resolve(app: Any, env: Any, node: pending_xref, contnode: nodes.Element) -> Any:
    """``missing-reference``: a link to where the object is documented, plain text
    for a real object that is not public, None (a warning: the build fails) for a
    name that names nothing."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    objects = env.get_domain("py").objects
    module, cls = node.get("py:module"), node.get("py:class")
    candidates = [target]
    if module and cls:
        candidates.append(f"{module}.{cls}.{target}")
    if module:
        candidates.append(f"{module}.{target}")

    head, _, rest = target.partition(".")
    imported = next((f for ctx in _contexts(node) if (f := _checker_imports(ctx).get(head))), None)
    if imported:  # a checker-only import: resolve what it names
        candidates.append(".".join([imported, *([rest] if rest else [])]))

    found = next((n for c in candidates if (n := _canonical(c, objects))), None)
    if found is None:
        found = next((c for c in candidates if c in objects), None)
    if found is None:
        ends = [
            n
            for n, e in objects.items()
            if not e.aliased and (n == target or n.endswith("." + target))
        ]
        found = ends[0] if len(ends) == 1 else None
    if found is not None:
        entry = objects[found]
        return make_refnode(
            app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, found
        )

    # Not public: real (plain text) or nothing (left to fail the build).
    if _lookup(target) is not _MISSING or imported:
        return contnode
    if module and cls and _lookup(f"{module}.{cls}.{target}") is not _MISSING:
        return contnode
    for ctx in _contexts(node):
        obj = getattr(sys.modules.get(ctx), head, _MISSING)
        if obj is not _MISSING and (not rest or _lookup_attr(obj, rest) is not _MISSING):
            return contnode
    return None


def _lookup_attr(obj: Any, dotted: str) -> Any:
    for attr in dotted.split("."):
        obj = getattr(obj, attr, _MISSING)
        if obj is _MISSING:
            break
    return obj


def data_docstring(
    app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """A public constant gets the ``#:`` comment of the module that defines it, not
    the docstring of its type (``int``, ``dict``) or of the class it aliases: the lazy
    packages re-export it, so autodoc cannot see the comment where it looks."""
    if what not in ("data", "attribute") or getattr(obj, "__doc__", None) is None:
        return
    alias = inspect.isclass(obj) and obj.__name__ != name.rpartition(".")[2]
    if not alias and obj.__doc__ != getattr(type(obj), "__doc__", None):
        return
    lines[:] = []
    package, _, attr = name.rpartition(".")
    if what != "data" or package not in PUBLIC:
        return
    where = getattr(sys.modules.get(package), "_EXPORTS", {}).get(attr, package)
    comment = ModuleAnalyzer.for_module(where).find_attr_docs().get(("", attr), [])
    lines[:] = list(comment)


def check_coverage(app: Any, env: Any) -> None:
    """Every public name is documented: under its own name or as the same object."""
    objects = env.get_domain("py").objects
    by_id = _INDEX.get(objects)
    for module in PUBLIC:
        mod = importlib.import_module(module)
        for name in public_names(module):
            if f"{module}.{name}" in objects:
                continue
            obj = getattr(mod, name)
            if _has_identity(obj) and id(obj) in by_id:
                continue
            logger.warning(
                "%s.%s is public (in __all__) but no API page documents it", module, name
            )


class PublicNames(SphinxDirective):
    """``publicnames MODULE``: a list of every public name of MODULE, each linked."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        module = self.arguments[0]
        items = nodes.bullet_list()
        for name in public_names(module):
            ref = pending_xref(
                "",
                nodes.literal(name, name, classes=["xref", "py", "py-obj"]),
                refdomain="py",
                reftype="obj",
                reftarget=f"{module}.{name}",
                refdoc=self.env.docname,
                refexplicit=True,
            )
            ref["py:module"] = module
            items += nodes.list_item("", nodes.paragraph("", "", ref))
        return [items]


def setup(app: Any) -> dict[str, Any]:
    app.connect("missing-reference", resolve)
    app.connect("autodoc-process-docstring", data_docstring, priority=400)  # before napoleon
    app.connect("env-check-consistency", check_coverage)
    app.add_directive("publicnames", PublicNames)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
