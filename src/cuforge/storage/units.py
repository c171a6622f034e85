"""Sizes and durations as people write them: ``500M``, ``2GiB``, ``500ms``, ``7d``.

One parser for the cache URLs, the command line and the settings files. Each raises
ValueError naming the text and what was expected, so callers can show the message
as it is.

A number without a unit is refused (``prune --older-than 30`` removed entries 30
seconds old, ``--max-size 2`` meant 2 bytes): people write the unit, ``B`` for
bytes. Cache URLs pass ``bare=True``: there a plain number is bytes or seconds,
because programs write those URLs (the command line itself puts ``?max_size=`` in
bytes into the URLs its worker processes open).
"""

from __future__ import annotations

import re

__all__ = [
    "NEGATIVE",
    "check_max_size",
    "format_size",
    "parse_duration",
    "parse_size",
    "positive_seconds",
]

#: What a negative size or duration is told, wherever it was written (the command
#: line's ``--max-size -1G``, which argparse takes for an option, says it too).
NEGATIVE = "{value} is negative: give a {kind} above zero, such as {bare}"

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_MAX_SIZE = (1 << 63) - 1  # what a signed 64-bit size field (SQLite, Redis) holds
_MAX_DURATION = 100 * 365.25 * 86400


def parse_size(text: str, *, bare: bool = False) -> int:
    """Bytes in ``text``: an integer or decimal with a unit -- ``B``, or K/M/G/T
    (binary multiples; ``KiB``, ``KB`` and ``K`` all mean 1024) -- computed exactly
    and rounded down. Must be > 0 and fit in 63 bits. A plain number is bytes only
    with ``bare`` (cache URLs); otherwise it is refused, naming the units."""
    _refuse_negative(text, "size")
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if match is None or match.group(3).lower() not in ("", "b", "ib"):
        raise ValueError(f"not a size: {text!r} (expected e.g. 500M, 2G, 64KiB)")
    if match.group(3).lower() == "ib" and not match.group(2):
        raise ValueError(f"not a size: {text!r} (expected e.g. 500M, 2G, 64KiB)")
    whole, _, frac = match.group(1).partition(".")
    if len(whole.lstrip("0")) > 19:  # before int(): huge digit strings are slow to convert
        raise ValueError(f"size too large: {text!r} (at most {_MAX_SIZE} bytes)")
    unit = _SIZE_UNITS[match.group(2).lower()]
    # Exact (no float rounding): the fraction's digits are scaled by the unit, floored.
    value = int(whole) * unit + (int(frac[:24]) * unit // 10 ** len(frac[:24]) if frac else 0)
    if value <= 0:
        raise ValueError(f"size must be > 0, got {text!r}")
    if not (bare or match.group(2) or match.group(3)):
        n = match.group(1)
        raise ValueError(f"{text!r} has no unit: write {n}B for bytes, or {n}K, {n}M, {n}G")
    if value > _MAX_SIZE:
        raise ValueError(f"size too large: {text!r} (at most {_MAX_SIZE} bytes)")
    return value


def parse_duration(text: str, *, bare: bool = False) -> float:
    """Seconds in ``text``: a number with a ms/s/m/h/d/w unit, in any case but ``M``
    (``30M`` reads as months as easily as minutes: refused). Must be > 0 and at
    most 100 years. A plain number is seconds only with ``bare`` (cache URLs);
    otherwise it is refused, naming the units."""
    _refuse_negative(text, "duration")
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not a duration: {text!r} (expected e.g. 500ms, 90s, 30m, 12h, 7d)")
    if match.group(2) == "M":  # 30M: minutes to this parser, months to a reader
        n = match.group(1)
        raise ValueError(
            f"{text!r}: M is not a duration unit (minutes or months?): write {n}m for "
            "minutes; months are no unit (write days or weeks: 90d, 13w)"
        )
    value = float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "s").lower()]
    if value <= 0:
        raise ValueError(f"duration must be > 0, got {text!r}")
    if not (bare or match.group(2)):
        n = match.group(1)
        raise ValueError(f"{text!r} has no unit: write {n}s, {n}m, {n}h or {n}d")
    if not value <= _MAX_DURATION:  # also inf from a huge digit string
        raise ValueError(f"duration too large: {text!r} (at most 100 years)")
    return value


def _refuse_negative(text: object, kind: str) -> None:
    """``-1G``, ``-5d``: said as negative (:data:`NEGATIVE`), not as "not a size",
    which hides why."""
    if isinstance(text, str) and text.strip().startswith("-") and text.strip() != "-":
        value = text.strip()
        raise ValueError(NEGATIVE.format(value=value, kind=kind, bare=value[1:]))


def format_size(n: int) -> str:
    """``n`` bytes for people: ``512 B``, ``1.5 KiB``, ``2.0 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - unreachable


def check_max_size(max_size_bytes: int | None) -> int | None:
    """A ``max_size_bytes`` argument: a positive int or None (TypeError, ValueError)."""
    if max_size_bytes is None:
        return None
    if isinstance(max_size_bytes, bool) or not isinstance(max_size_bytes, int):
        raise TypeError(
            f"max_size_bytes must be a positive int or None, got {type(max_size_bytes).__name__}"
        )
    if max_size_bytes <= 0:
        raise ValueError(f"max_size_bytes must be > 0 or None, got {max_size_bytes}")
    return max_size_bytes


def positive_seconds(name: str, value: float) -> float:
    """``value`` as seconds > 0; ValueError naming the argument ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)
