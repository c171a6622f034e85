"""What a compile accepts: one rule for ``Program`` and ``make_program_cache_key``.

Guarantee: the key function refuses exactly the code, name expressions and
(code_type, target, options) combinations that ``Program``/``Program.compile``
refuse, with the same exception type and message, because both call these
checks. (The key function refuses more only for what a cache cannot observe:
options with compile-time side effects, precompiled headers, libdevice, untrackable
includes -- and ``compile(cache=)`` refuses those too, through the key.)
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time (the CLI's hit path)
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

__all__ = ["check_target", "code_bytes", "name_tuple"]


def code_bytes(code: Any, code_type: str) -> bytes:
    """``code`` as bytes: str for every code type (UTF-8), bytes or bytearray also for
    "nvvm" (bitcode). ``code_type`` must be canonical.

    Raises TypeError for another type and ValueError for empty or blank code.
    """
    if isinstance(code, str):
        data = code.encode()
    elif isinstance(code, (bytes, bytearray)) and code_type == "nvvm":
        data = bytes(code)
    else:
        allowed = "str or bytes" if code_type == "nvvm" else "str"
        hint = " (bytes only for 'nvvm' bitcode)" if isinstance(code, (bytes, bytearray)) else ""
        raise TypeError(
            f"code for code_type {code_type!r} must be {allowed}, got {type(code).__name__}{hint}"
        )
    if not data or data.isspace():
        raise ValueError("code must not be empty")
    return data


def name_tuple(code_type: str, name_expressions: Iterable[Any]) -> tuple[str | bytes, ...]:
    """The name expressions as a tuple: each str or bytes, and only for "c++".

    Raises TypeError for a non-iterable or an item of another type (bytearray is
    unhashable and could not key ``ObjectCode.symbol_mapping``), ValueError for
    names given to a PTX or NVVM program.
    """
    if type(name_expressions) is tuple and not name_expressions:  # the default: no checks
        return ()
    if isinstance(name_expressions, (str, bytes)):
        raise TypeError(
            "name_expressions must be a list of names, not a single "
            f"{type(name_expressions).__name__}"
        )
    try:
        names = tuple(name_expressions)
    except TypeError:
        raise TypeError(
            f"name_expressions must be an iterable of str or bytes, got "
            f"{type(name_expressions).__name__}"
        ) from None
    for i, expr in enumerate(names):
        if not isinstance(expr, (str, bytes)):
            raise TypeError(
                f"name_expressions[{i}] must be str or bytes, got {type(expr).__name__}"
            )
    if names and code_type != "c++":
        raise ValueError(f"name_expressions apply to code_type 'c++' only, not {code_type!r}")
    return names


def check_target(options: Any, target: str) -> None:
    """Refuse a canonical ``target`` that contradicts ``options`` (ValueError): a
    cubin needs a real architecture, and LTO options produce LTO-IR only."""
    if target == "cubin" and not (options.arch or "").startswith("sm_"):
        raise ValueError(
            f"target 'cubin' needs a real architecture (sm_XY); "
            f"ProgramOptions.arch is {options.arch!r}"
        )
    lto = bool(options.link_time_optimization)
    if target != "ltoir" and lto:
        raise ValueError(
            "ProgramOptions.link_time_optimization=True produces LTO-IR; compile to "
            f"'ltoir' (not {target!r}) or unset it"
        )
