"""Frozen dataclasses without importing ``dataclasses`` (a start-up cost, not a feature).

``import dataclasses`` imports ``inspect`` -- with ``ast``, ``dis``, ``tokenize``,
``re`` and ``enum`` behind it -- about 6 ms of a cold process, paid by every script
whose first line is ``from cuforge import Program, ProgramOptions``.
:func:`dataclass` (``@dataclass(frozen=True)``) makes the same class a frozen
``dataclasses.dataclass`` would, for the classes that need no more than that:

- ``__init__`` with the fields as parameters, in declaration order, defaults as
  declared (``field(default=..., metadata=...)`` or a plain value), then
  ``__post_init__`` when the class has one; a field without a default is required.
- ``__repr__``, ``__eq__`` (same class, equal fields), ``__hash__`` (of the fields),
  ``__match_args__``; assigning or deleting an attribute raises
  ``dataclasses.FrozenInstanceError`` (imported then, on that error path only);
  ``object.__setattr__`` in ``__post_init__`` still sets a field.
- ``dataclasses.fields()``, ``replace()``, ``asdict()`` and ``is_dataclass()`` work
  on the class and its instances: ``__dataclass_fields__`` is made, by the real
  ``dataclasses``, the first time something asks for it.
- Instances keep a ``__dict__`` (the compile layer memoises derived values in it).
- No inherited fields: a class whose base is such a class (or a dataclass) is a
  TypeError, not a class that silently lacks the base's fields.

Type checkers are told the class is a ``dataclasses.dataclass`` (the module using it
imports ``dataclass`` and ``field`` from ``dataclasses`` under ``TYPE_CHECKING``), so
they check constructor calls against the fields. The ``__init__`` is compiled from
generated source when the class is made (as ``dataclasses`` does), so
``inspect.signature`` and ``help()`` show the real parameters.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

__all__ = ["Field", "dataclass", "field", "fields"]

_MISSING: Any = object()


class Field:
    """One declared field: ``name``, ``default`` (``_MISSING``: required) and
    ``metadata`` (a mapping, as ``dataclasses.Field.metadata``)."""

    __slots__ = ("default", "metadata", "name", "type")

    def __init__(self, default: Any = _MISSING, metadata: Mapping[str, Any] | None = None) -> None:
        self.name = ""
        self.type: Any = None
        self.default = default
        self.metadata: Mapping[str, Any] = {} if metadata is None else metadata

    def __repr__(self) -> str:
        return f"Field(name={self.name!r}, default={self.default!r})"


def field(*, default: Any = _MISSING, metadata: Mapping[str, Any] | None = None) -> Any:
    """A field with a default and metadata (``dataclasses.field``'s two arguments)."""
    return Field(default, metadata)


def fields(class_or_instance: Any) -> tuple[Field, ...]:
    """The fields of a class :func:`dataclass` made (or of its instance), in order."""
    found: tuple[Field, ...] = class_or_instance._cuforge_fields
    return found


class _DataclassView:
    """``__dataclass_fields__`` / ``__dataclass_params__`` on first access: the
    ``dataclasses`` module's own records of the class, made by it (a twin class
    declared with the same fields) and then kept on the class in this one's place."""

    def __init__(self, attribute: str) -> None:
        self.attribute = attribute

    def __get__(self, instance: object, owner: type) -> Any:
        import dataclasses

        declared = owner._cuforge_fields  # type: ignore[attr-defined]
        spec = [
            (f.name, f.type, dataclasses.field(default=f.default, metadata=f.metadata))
            if f.default is not _MISSING
            else (f.name, f.type, dataclasses.field(metadata=f.metadata))
            for f in declared
        ]
        twin = dataclasses.make_dataclass(owner.__name__, spec, frozen=True)
        for name in ("__dataclass_fields__", "__dataclass_params__"):
            setattr(owner, name, getattr(twin, name))  # replaces these views
        return getattr(twin, self.attribute)


def dataclass(*, frozen: bool = True) -> Callable[[type], type]:
    """``@dataclass(frozen=True)``: see the module docstring (frozen classes only)."""
    if not frozen:
        raise TypeError("cuforge._fields.dataclass makes frozen classes only")
    return _make


def _make(cls: type) -> type:
    inherited = [b.__name__ for b in cls.__mro__[1:] if "_cuforge_fields" in vars(b)]
    inherited += [b.__name__ for b in cls.__mro__[1:] if "__dataclass_fields__" in vars(b)]
    if inherited:  # their fields would be silently left out of this class's
        raise TypeError(f"{cls.__name__}: cuforge._fields cannot inherit fields ({inherited[0]})")
    # the class's own annotations (strings: ``from __future__ import annotations``)
    annotations: dict[str, Any] = cls.__dict__.get("__annotations__") or {}  # noqa: RUF063
    declared: list[Field] = []
    for name, kind in annotations.items():
        value = cls.__dict__.get(name, _MISSING)
        spec = value if isinstance(value, Field) else Field(value)
        if spec.default is _MISSING and declared and declared[-1].default is not _MISSING:
            raise TypeError(f"non-default argument {name!r} follows default argument")
        spec.name, spec.type = name, kind
        if spec.default is _MISSING:
            if name in cls.__dict__:
                delattr(cls, name)
        else:
            setattr(cls, name, spec.default)
        declared.append(spec)
    names = tuple(f.name for f in declared)
    cls._cuforge_fields = tuple(declared)  # type: ignore[attr-defined]
    cls.__init__ = _init(cls, declared)  # type: ignore[misc]
    cls.__repr__ = _repr(names)  # type: ignore[assignment]
    cls.__eq__ = _eq(names)  # type: ignore[assignment]
    cls.__hash__ = _hash(names)  # type: ignore[assignment]
    cls.__setattr__ = _frozen_setattr(cls, names)  # type: ignore[assignment]
    cls.__delattr__ = _frozen_delattr(cls, names)  # type: ignore[assignment]
    cls.__replace__ = _replace(names)  # type: ignore[attr-defined]
    setattr(cls, "__match_args__", names)  # noqa: B010 - no such attribute on type
    cls.__dataclass_fields__ = _DataclassView("__dataclass_fields__")  # type: ignore[attr-defined]
    cls.__dataclass_params__ = _DataclassView("__dataclass_params__")  # type: ignore[attr-defined]
    return cls


def _init(cls: type, declared: list[Field]) -> Callable[..., None]:
    """``__init__(self, <fields>)``: each field into the instance's ``__dict__``, then
    ``__post_init__`` when the class has one."""
    params = ", ".join(
        f.name if f.default is _MISSING else f"{f.name}=__default[{i}]"
        for i, f in enumerate(declared)
    )
    body = "".join(f"    __d[{f.name!r}] = {f.name}\n" for f in declared)
    post = "    self.__post_init__()\n" if hasattr(cls, "__post_init__") else ""
    source = f"def __init__(self, {params}):\n    __d = self.__dict__\n{body}{post}"
    scope: dict[str, Any] = {"__default": [f.default for f in declared]}
    exec(source, scope)
    init: Callable[..., None] = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    return init


def _repr(names: tuple[str, ...]) -> Callable[[object], str]:
    def __repr__(self: object) -> str:
        inner = ", ".join([f"{name}={getattr(self, name)!r}" for name in names])
        return f"{type(self).__qualname__}({inner})"

    return __repr__


def _fields_tuple(var: str, names: tuple[str, ...]) -> str:
    """Source of the tuple of ``var``'s field values, read straight from its dict (as
    the functions dataclasses generates do: no ``map`` and no call per use)."""
    return "(" + "".join(f"{var}.__dict__[{name!r}], " for name in names) + ")"


def _generated(name: str, source: str) -> Callable[..., Any]:
    scope: dict[str, Any] = {}
    exec(source, scope)
    made: Callable[..., Any] = scope[name]
    return made


def _eq(names: tuple[str, ...]) -> Callable[[object, object], bool]:
    mine, theirs = _fields_tuple("self", names), _fields_tuple("other", names)
    return _generated(
        "__eq__",
        "def __eq__(self, other):\n"
        "    if other.__class__ is not self.__class__:\n"
        "        return NotImplemented\n"
        f"    return {mine} == {theirs}\n",
    )


def _hash(names: tuple[str, ...]) -> Callable[[object], int]:
    return _generated(
        "__hash__", f"def __hash__(self):\n    return hash({_fields_tuple('self', names)})\n"
    )


def _frozen_error(name: str) -> BaseException:
    from dataclasses import FrozenInstanceError

    return FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_setattr(cls: type, names: tuple[str, ...]) -> Callable[[object, str, object], None]:
    def __setattr__(self: object, name: str, value: object) -> None:
        if type(self) is cls or name in names:
            raise _frozen_error(name)
        object.__setattr__(self, name, value)

    return __setattr__


def _frozen_delattr(cls: type, names: tuple[str, ...]) -> Callable[[object, str], None]:
    def __delattr__(self: object, name: str) -> None:
        if type(self) is cls or name in names:
            from dataclasses import FrozenInstanceError

            raise FrozenInstanceError(f"cannot delete field {name!r}")
        object.__delattr__(self, name)

    return __delattr__


def _replace(names: tuple[str, ...]) -> Callable[..., object]:
    def __replace__(self: object, /, **changes: Any) -> object:
        kept = {name: getattr(self, name) for name in names if name not in changes}
        return type(self)(**kept, **changes)

    return __replace__
