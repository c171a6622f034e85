"""Coercion of option values to canonical, hashable forms.

Guarantee: each checker returns the canonical value (bools stay bools, sequences
become tuples, paths become str) or raises TypeError for a wrong type and
ValueError for a wrong value, naming ``owner.field`` and what was expected. ``None``
always passes through as "unset".
"""

from __future__ import annotations

import os

from cuforge._archname import arch_ok

TYPE_CHECKING = False  # typing and re cost a cold process ~8 ms: not at run time
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeAlias

    Checker: TypeAlias = Callable[[str, Any], Any]


def _type_error(where: str, expected: str, value: Any) -> TypeError:
    return TypeError(f"{where} must be {expected}, got {type(value).__name__} ({value!r})")


def check_bool(where: str, value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise _type_error(where, "a bool or None", value)


def int_checker(minimum: int, maximum: int | None = None) -> Checker:
    def check(where: str, value: Any) -> int | None:
        if value is None:
            return None
        # bool is an int subclass; True as a register count is a bug, not a request.
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(where, "an int or None", value)
        if value < minimum or (maximum is not None and value > maximum):
            upper = f" and <= {maximum}" if maximum is not None else ""
            raise ValueError(f"{where} must be >= {minimum}{upper}, got {value}")
        return int(value)

    return check


def check_str(where: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _type_error(where, "a str or None", value)
    if not value or "\0" in value:
        raise ValueError(f"{where} must be a non-empty str without NUL, got {value!r}")
    return value


def check_path(where: str, value: Any) -> str | None:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bytes):
        raise _type_error(where, "a str or os.PathLike path", value)
    return check_str(where, value)


def _sequence(where: str, value: Any, one: Checker, expected: str) -> tuple[Any, ...] | None:
    """A single item or a list/tuple of items, as a tuple (order kept: it matters)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(one(f"{where}[{i}]", item) for i, item in enumerate(value))
    try:
        return (one(where, value),)
    except TypeError:
        raise _type_error(where, expected, value) from None


def check_strs(where: str, value: Any) -> tuple[str, ...] | None:
    return _sequence(where, value, check_str, "a str or a list/tuple of str")


def check_paths(where: str, value: Any) -> tuple[str, ...] | None:
    return _sequence(where, value, check_path, "a path or a list/tuple of paths")


def check_ints(where: str, value: Any) -> tuple[int, ...] | None:
    return _sequence(where, value, int_checker(0), "an int or a list/tuple of int")


def choice_checker(choices: tuple[str, ...]) -> Checker:
    def check(where: str, value: Any) -> str | None:
        text = check_str(where, value)
        if text is not None and text not in choices:
            raise ValueError(f"{where} must be one of {', '.join(choices)}; got {text!r}")
        return text

    return check


def check_macros(where: str, value: Any) -> tuple[str, ...] | None:
    """``"N"``, ``"N=V"``, ``("N", "V")``, or a list of those -> ``("N", "N=V", ...)``.

    A top-level 2-tuple of str is one (name, value) pair, as in cuda.core; use a
    list for several macros.
    """
    if value is None:
        return None
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value):
        items: list[Any] = [value]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    out = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]" if len(items) > 1 or isinstance(value, list) else where
        if isinstance(item, tuple):
            if len(item) != 2 or not all(isinstance(v, str) for v in item):
                raise _type_error(at, "a (name, value) tuple of two str", item)
            name, definition = item
            text = f"{name}={definition}"
        elif isinstance(item, str):
            name = item.split("=", 1)[0]
            text = item
        else:
            raise _type_error(at, "a str 'NAME[=VALUE]' or a (name, value) tuple", item)
        if not macro_name_ok(name):
            raise ValueError(f"{at} has an invalid macro name {name!r}")
        if "\0" in text:
            raise ValueError(f"{at} must not contain NUL")
        out.append(text)
    return tuple(out)


def check_sources(where: str, value: Any) -> tuple[tuple[str, bytes], ...] | None:
    """``[(name, str | bytes), ...]`` -> ``((name, bytes), ...)``; str is UTF-8 text."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise _type_error(where, "a list/tuple of (name, code) tuples", value)
    out = []
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise _type_error(at, "a (name: str, code: str | bytes) tuple", item)
        name, code = item
        if isinstance(code, str):
            code = code.encode()
        elif isinstance(code, (bytes, bytearray, memoryview)):
            code = bytes(code)
        else:
            raise _type_error(f"{at}[1]", "str or bytes", code)
        if not code:
            raise ValueError(f"{at} has empty code")
        out.append((name, code))
    return tuple(out)


def macro_name_ok(name: str) -> bool:
    """Whether ``name`` is a macro name, with a parameter list or not: the whole of it
    matches ``[A-Za-z_]\\w*(\\([\\w\\s,.]*\\))?`` (written out: ``re`` costs a cold
    process ~3 ms; ``\\w`` is a letter, digit or ``_``, ``\\s`` white space, Unicode's)."""
    if not name or not (name[0] == "_" or "a" <= name[0] <= "z" or "A" <= name[0] <= "Z"):
        return False
    head, paren, params = name.partition("(")
    if not all(c == "_" or c.isalnum() for c in head[1:]):
        return False
    if not paren:
        return True
    return params.endswith(")") and all(
        c == "_" or c.isalnum() or c.isspace() or c in ",." for c in params[:-1]
    )


def check_arch(where: str, value: Any) -> str | None:
    """``"sm_90"``, ``"sm_90a"``, ``"compute_100f"``...; None means "probe the device"."""
    text = check_str(where, value)
    if text is not None and not arch_ok(text):
        raise ValueError(
            f"{where} must look like 'sm_90' (or 'compute_90', with an optional 'a'/'f' "
            f"suffix), got {text!r}"
        )
    return text


def arch_number(arch: str) -> str:
    """``"sm_90a"`` -> ``"90a"``."""
    return arch.split("_", 1)[1]
