"""File names as text: one escape for labels and printed names.

A name the OS accepts may hold bytes that are not UTF-8 (``k\\xfc.cu``, Latin-1);
Python gives it as a str with each such byte a lone surrogate (``os.fsdecode``:
``\\udcfc``). Where a C API takes the name it gets the bytes (``os.fsencode``);
where only text is taken -- nvJitLink's and libNVVM's input labels, a line printed
by the command line -- :func:`shown` writes each such byte as ``\\xNN``.

A name may also hold control characters (``nl\\nx.cu``: a newline); printed raw,
one name would take two lines of a listing meant as one line per entry, or a tab
would add a column. :func:`printed` -- what the command line prints a name with --
writes them as ``\\n``, ``\\t``, ``\\r``, ``\\xNN`` too.

Guarantee: :func:`shown` returns a name that is valid Unicode unchanged (the same
object), :func:`printed` one that also holds no control character (the same object
when ``str.isprintable``), so nothing changes for an ordinary name; the result always
encodes as UTF-8. Stdlib only.
"""

from __future__ import annotations

import codecs

__all__ = ["ESCAPE", "printed", "register", "shown"]

#: The codec error handler :func:`register` installs: ``\xNN`` for a byte
#: ``os.fsdecode`` could not decode, ``\xNN``/``\uNNNN`` for a character the
#: stream's encoding cannot show (as ``backslashreplace``).
ESCAPE = "cuforge.escape"


def _escaped(text: str) -> str:
    out = []
    for ch in text:
        point = ord(ch)
        if 0xDC80 <= point <= 0xDCFF:  # a byte os.fsdecode could not decode
            out.append(f"\\x{point - 0xDC00:02x}")
        else:
            out.append(ch.encode("ascii", "backslashreplace").decode("ascii"))
    return "".join(out)


def shown(name: str) -> str:
    """``name`` with each byte that is not UTF-8 (a lone surrogate from
    ``os.fsdecode``) as ``\\xNN``; unchanged when it holds none."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "".join(ch if not 0xD800 <= ord(ch) <= 0xDFFF else _escaped(ch) for ch in name)
    return name


_CONTROL = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _breaks(point: int) -> bool:
    """Whether character ``point`` is a control character (C0, DEL, C1) or a line or
    paragraph separator (U+2028/9, which ``str.splitlines`` reads as line ends)."""
    return point < 0x20 or 0x7F <= point <= 0x9F or point in (0x2028, 0x2029)


def printed(name: str) -> str:
    """``name`` for one line of output: as :func:`shown`, and each control character
    written ``\\n``, ``\\t``, ``\\r`` or ``\\xNN`` (``\\u2028`` for a line
    separator), so the name is one field of one line. ``name`` itself when it is
    printable (``str.isprintable``: one C loop, the common case)."""
    if name.isprintable():
        return name
    out = []
    for ch in shown(name):
        point = ord(ch)
        if not _breaks(point):
            out.append(ch)
        elif ch in _CONTROL:
            out.append(_CONTROL[ch])
        else:
            out.append(f"\\x{point:02x}" if point < 0x100 else f"\\u{point:04x}")
    return "".join(out)


def _handler(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return _escaped(exc.object[exc.start : exc.end]), exc.end


def register() -> str:
    """Install the :data:`ESCAPE` error handler (idempotent); returns its name, for
    ``stream.reconfigure(errors=...)``."""
    codecs.register_error(ESCAPE, _handler)
    return ESCAPE
