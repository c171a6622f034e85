"""One level of a cache URL, parsed but not opened: what a backend's opener reads.

A backend's ``_url.py`` opener takes a :class:`CacheSpec` and reads its location
and query parameters through it (sizes, durations, flags, ``trust=shared``), every
error a ValueError naming the URL. ``storage.urls`` parses URLs into specs and
opens them; a backend imports this module only, so no backend reaches another one
(or the in-memory or tiered caches) through the URL machinery.
"""

from __future__ import annotations

from .units import parse_duration, parse_size

TYPE_CHECKING = False  # typing and dataclasses cost a cold process ~10 ms: not here
if TYPE_CHECKING:
    from typing import Any

__all__ = ["CacheSpec", "unquote", "url_port"]


def unquote(text: str) -> str:
    """Percent-decode ``text``; urllib.parse (and ipaddress with it, ~2 ms of a cold
    process) is imported only when there is something to decode."""
    if "%" not in text:
        return text
    from urllib.parse import unquote as decode

    return decode(text)


def url_port(netloc: str) -> int | None:
    """The port of a URL's ``netloc`` (``user:pw@host:port``, ``[::1]:port``), None
    when it names none; ValueError (``port 'p' is not a number``, ``port 99999 is out
    of range 1-65535``) for one no server can listen on -- port 0 included, which
    ``urllib`` accepts and a client would read as "the default" or fail to reach."""
    host = netloc.rpartition("@")[2]
    if host.startswith("["):  # an IPv6 address: the port follows "]:"
        raw = host.partition("]")[2].partition(":")[2]
    else:
        raw = host.partition(":")[2]
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError(f"port {raw!r} is not a number")
    port = int(raw)
    if not 1 <= port <= 65535:
        raise ValueError(f"port {raw} is out of range 1-65535")
    return port


class CacheSpec:
    """One level of a cache URL, parsed but not opened (a value: compare, never change).

    ``signed``: entries are signed (``open_level`` with a secret): a backend may then
    accept a location other users can write, as ``?trust=shared`` does.
    """

    __slots__ = ("location", "params", "read_only", "scheme", "signed", "text")

    def __init__(
        self,
        scheme: str,
        location: str,
        params: dict[str, str] | None = None,
        read_only: bool = False,
        text: str = "",
        signed: bool = False,
    ) -> None:
        self.scheme = scheme
        self.location = location
        self.params: dict[str, str] = {} if params is None else params
        self.read_only = read_only
        self.text = text
        self.signed = signed

    def _fields(self) -> tuple[Any, ...]:
        return (self.scheme, self.location, self.params, self.read_only, self.text, self.signed)

    def __eq__(self, other: object) -> bool:
        return type(other) is CacheSpec and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # params is a dict

    def __repr__(self) -> str:
        names = ("scheme", "location", "params", "read_only", "text", "signed")
        inner = ", ".join(f"{n}={v!r}" for n, v in zip(names, self._fields(), strict=True))
        return f"CacheSpec({inner})"

    def as_signed(self) -> CacheSpec:
        """This level with ``signed`` set."""
        return CacheSpec(self.scheme, self.location, self.params, self.read_only, self.text, True)

    def as_read_only(self) -> CacheSpec:
        """This level with ``read_only`` set (as if it carried ``?ro``)."""
        return CacheSpec(self.scheme, self.location, self.params, True, self.text, self.signed)

    def error(self, message: str) -> ValueError:
        """A ValueError that names this level of the URL."""
        return ValueError(f"cache URL {self.text!r}: {message}")

    def size(self, name: str) -> int | None:
        """Parameter ``name`` as a size (``64M``), or None when absent."""
        raw = self.params.get(name)
        if raw is None:
            return None
        try:
            return parse_size(raw, bare=True)
        except ValueError as exc:
            raise self.error(f"{name}: {exc}") from None

    def text_param(self, name: str) -> str | None:
        """Parameter ``name`` as text, or None when absent; an empty value
        (``region=``) is refused rather than read as "use the default"."""
        raw = self.params.get(name)
        if raw == "":
            raise self.error(f"{name}= has no value (give one, or leave {name} out)")
        return raw

    def duration(self, name: str) -> float | None:
        """Parameter ``name`` as seconds (``7d``), or None when absent."""
        raw = self.params.get(name)
        if raw is None:
            return None
        try:
            return parse_duration(raw, bare=True)
        except ValueError as exc:
            raise self.error(f"{name}: {exc}") from None

    def trust_shared(self) -> bool:
        """Whether other users may write this level's location: ``?trust=shared``,
        or signed entries (a planted entry cannot carry a valid signature)."""
        raw = self.params.get("trust")
        if raw is None:
            return self.signed
        if raw != "shared":
            raise self.error(f"trust={raw!r}: the only value is 'shared' (trust=shared)")
        return True

    def flag(self, name: str) -> bool:
        """Parameter ``name`` as a boolean (present, 1/true/yes/on; 0/false/no/off)."""
        raw = self.params.get(name)
        if raw is None:
            return False
        value = raw.lower()
        if value in ("", "1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise self.error(f"{name}={raw!r} is not a boolean (use 1 or 0)")
