"""Terminal output: colour, tables and a progress bar -- only on a terminal.

Stdlib only (the command line must start fast; ``rich`` costs more to import than a
whole cache hit). Colour needs a terminal and no ``NO_COLOR`` (https://no-color.org:
present and non-empty) and a ``TERM`` other than ``dumb``. Off a terminal, tables
become tab-separated lines without a header (for ``cut``/``awk``) and the progress
bar becomes one plain line per finished item.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TextIO

__all__ = ["Progress", "ago", "is_tty", "paint", "table"]

_STYLES = {"red": "31", "green": "32", "yellow": "33", "blue": "34", "bold": "1", "dim": "2"}


def is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def colour_on(stream: TextIO) -> bool:
    return is_tty(stream) and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def paint(text: str, style: str, stream: TextIO = sys.stdout) -> str:
    """``text`` in ``style`` when ``stream`` takes colour, else unchanged."""
    if not colour_on(stream):
        return text
    return f"\033[{_STYLES[style]}m{text}\033[0m"


def _visible(text: str) -> int:
    out, i = 0, 0
    while i < len(text):
        if text[i] == "\033":
            i = text.find("m", i) + 1 or len(text)
            continue
        out += 1
        i += 1
    return out


def table(
    header: list[str], rows: list[list[str]], stream: TextIO = sys.stdout, right: str = ""
) -> str:
    """Aligned columns under a header on a terminal; tab-separated rows otherwise.

    ``right``: one character per column, ``r`` to right-align it (numbers).
    """
    if not is_tty(stream):
        return "\n".join("\t".join(row) for row in rows)
    widths = [
        max([_visible(header[i])] + [_visible(r[i]) for r in rows]) for i in range(len(header))
    ]

    def line(cells: list[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            pad = " " * (widths[i] - _visible(cell))
            out.append(pad + cell if right[i : i + 1] == "r" else cell + pad)
        return "  ".join(out).rstrip()

    lines = [paint(line(header), "bold", stream)] + [line(r) for r in rows]
    return "\n".join(lines)


def ago(ns: int, now_ns: int | None = None) -> str:
    """``3s``, ``5m``, ``2h``, ``4d`` before now (``-`` for 0, ``future`` ahead)."""
    if not ns:
        return "-"
    seconds = ((now_ns or time.time_ns()) - ns) / 1e9
    if seconds < -1:
        return "future"
    for limit, unit, size in ((120, "s", 1), (7200, "m", 60), (172800, "h", 3600)):
        if seconds < limit:
            return f"{max(0, int(seconds // size))}{unit} ago"
    return f"{int(seconds // 86400)}d ago"


class Progress:
    """``done/total`` with a bar on a terminal (one line redrawn on stderr); off a
    terminal, :meth:`item` prints one plain line per finished item to ``lines``
    (stdout unless the caller's stdout is for machines)."""

    def __init__(self, total: int, label: str, lines: TextIO | None = None) -> None:
        self.lines = lines
        self.total = total
        self.done = 0
        self.label = label
        self.tty = is_tty(sys.stderr)
        self._start = time.monotonic()
        self._last = 0.0

    def item(self, line: str) -> None:
        """One item finished; ``line`` says how (printed as is off a terminal)."""
        self.done += 1
        if not self.tty:
            print(line, file=self.lines or sys.stdout, flush=True)
            return
        now = time.monotonic()
        if now - self._last >= 0.05 or self.done == self.total:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        width = 30
        filled = int(width * self.done / max(1, self.total))
        bar = "#" * filled + "-" * (width - filled)
        elapsed = now - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (
            f", eta {(self.total - self.done) / rate:.0f}s"
            if rate and self.done < self.total
            else ""
        )
        text = f"\r{self.label} [{bar}] {self.done}/{self.total} {elapsed:.1f}s{eta}"
        sys.stderr.write(text + "\033[K")
        sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
