"""Lazy public names: a package maps each public name to the module that defines it
and imports that module on first use, so ``import cuforge`` loads nothing heavy.

:func:`exports` returns the package's ``__getattr__`` and ``__dir__``. An unknown name
raises AttributeError naming the package; a resolved name is stored in the package's
namespace, so each name is looked up once. ``dir()`` shows the public names and dunders
only (not ``annotations``, ``TYPE_CHECKING`` or private helpers). A failing import
propagates unchanged (e.g. ``RedisProgramCache`` without redis-py says what to install).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

__all__ = ["exports"]


def exports(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, resolving ``names`` (public name ->
    defining module) lazily."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        # __import__ and sys.modules, not importlib (whose import costs a cold process
        # its package and warnings): the same for these absolute module names
        __import__(module)
        value = getattr(sys.modules[module], name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        # the public names and the module's dunders; not the implementation's own
        # (``annotations`` from the __future__ import, ``TYPE_CHECKING``, ``_lazy``...)
        public = set(namespace.get("__all__") or ())
        shown = {n for n in namespace if n.startswith("__") or n in public}
        return sorted(shown | set(names))

    return __getattr__, __dir__
