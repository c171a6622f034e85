"""Which code types cuforge compiles, and to which targets.

Guarantee: ``normalize_code_type`` and ``normalize_target`` are the single source of
truth for the supported matrix; ``Program.compile`` and the cache key both use them,
so a pair one accepts the other accepts too. Matching is case-insensitive and the
returned spelling is the canonical lower-case one.

:func:`compile_target` is the whole target rule -- the supported pair, then what the
options contradict (``_inputs.check_target``). Every way into a compile runs it:
``Program.compile`` (as its two steps), ``compile_through_cache`` (the command
line's cached path) before its lookup, the compile step itself before any backend
runs, and the command line before it plans anything. So no path compiles, or stores
in a cache, an output under a target its backend does not make (NVVM IR "to cubin"
was libNVVM's PTX, stored as a cubin).
"""

from __future__ import annotations

from cuforge.compile._inputs import check_target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: code_type -> targets it can be compiled to, in the order error messages list them.
SUPPORTED_TARGETS: dict[str, tuple[str, ...]] = {
    "c++": ("ptx", "cubin", "ltoir"),
    "ptx": ("cubin",),
    "nvvm": ("ptx", "ltoir"),
}


def normalize_code_type(code_type: str) -> str:
    """The canonical code_type for ``code_type``.

    Raises:
        TypeError: ``code_type`` is not a str.
        ValueError: it is not one of ``SUPPORTED_TARGETS`` (the message lists them).
    """
    if not isinstance(code_type, str):
        raise TypeError(f"code_type must be a str, got {type(code_type).__name__}")
    canonical = code_type.strip().lower()
    if canonical not in SUPPORTED_TARGETS:
        raise ValueError(
            f"unsupported code_type {code_type!r}; valid code types are "
            + ", ".join(repr(c) for c in SUPPORTED_TARGETS)
        )
    return canonical


def normalize_target(code_type: str, target_type: str) -> str:
    """The canonical target_type for compiling ``code_type`` to ``target_type``.

    Raises:
        TypeError: ``target_type`` is not a str.
        ValueError: the pair is unsupported (the message lists the valid targets).
    """
    code_type = normalize_code_type(code_type)
    if not isinstance(target_type, str):
        raise TypeError(f"target_type must be a str, got {type(target_type).__name__}")
    canonical = target_type.strip().lower()
    valid = SUPPORTED_TARGETS[code_type]
    if canonical not in valid:
        raise ValueError(
            f"unsupported target_type {target_type!r} for code_type {code_type!r}; "
            "valid targets are " + ", ".join(repr(t) for t in valid)
        )
    return canonical


def compile_target(code_type: str, options: Any, target_type: str) -> str:
    """The canonical target for compiling ``code_type`` (canonical) to ``target_type``
    under ``options``: :func:`normalize_target` (the supported pairs), then
    ``_inputs.check_target`` (what the options contradict).

    Raises TypeError when ``target_type`` is not a str, ValueError for an unsupported
    pair (the message lists the valid targets) or a contradiction.
    """
    target = (
        target_type
        if target_type in SUPPORTED_TARGETS[code_type]
        else normalize_target(code_type, target_type)
    )
    check_target(options, target)
    return target


__all__ = [
    "SUPPORTED_TARGETS",
    "compile_target",
    "normalize_code_type",
    "normalize_target",
]
