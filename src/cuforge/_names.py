"""File names that are not UTF-8, as text: one escape for labels and printed names.

A name the OS accepts may hold bytes that are not UTF-8 (``k\\xfc.cu``, Latin-1);
Python gives it as a str with each such byte a lone surrogate (``os.fsdecode``:
``\\udcfc``). Where a C API takes the name it gets the bytes (``os.fsencode``);
where only text is taken -- nvJitLink's and libNVVM's input labels, a line printed
by the command line -- :func:`shown` writes each such byte as ``\\xNN``.

Guarantee: a name that is valid Unicode is returned unchanged (the same object), so
nothing changes for a UTF-8 name; the result always encodes as UTF-8. Stdlib only.
"""

from __future__ import annotations

import codecs

__all__ = ["ESCAPE", "register", "shown"]

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


def _handler(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return _escaped(exc.object[exc.start : exc.end]), exc.end


def register() -> str:
    """Install the :data:`ESCAPE` error handler (idempotent); returns its name, for
    ``stream.reconfigure(errors=...)``."""
    codecs.register_error(ESCAPE, _handler)
    return ESCAPE
