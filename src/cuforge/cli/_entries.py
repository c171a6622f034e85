"""The command line's view of cache entries: what each is, read from its metadata.

Every backend lists entries through ``ProgramCacheResource.iter_entries`` with their
metadata record (``cuforge.storage.record``): ``program`` entries (a compiled
binary: target, arch, source name, compiler build), ``manifest`` entries (header
manifests of tracked C++ compiles: which header versions made which entry), the
integrations' kinds, ``raw`` entries stored by other code with no record, and
``signed`` entries listed without the secret: stored signed, their record inside the
signature envelope and unverified, so not read as one (:data:`SIGNED`).
"""

from __future__ import annotations

import re

from cuforge.cli._args import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from cuforge.storage.base import ProgramCacheResource
    from cuforge.storage.entry import EntryInfo

__all__ = [
    "COMPILER_NAMES",
    "SHORT",
    "SIGNED",
    "SIGNED_NOTE",
    "Row",
    "compiler_matcher",
    "find",
    "manifest_entry_ids",
    "rows",
    "short_compiler",
]


#: The kind of an entry stored signed, listed by a command that has no secret.
SIGNED = "signed"
#: What ``show`` says of such an entry's record ("verifies" is then its integrity only).
SIGNED_NOTE = (
    "not read, and the signature not checked: the entry is signed and no secret is set "
    "(CUFORGE_CACHE_SECRET or secret_file)"
)

#: Hex digits of an entry id shown everywhere (ls, show, explain, prune, the logger);
#: ``show`` takes any unique prefix.
SHORT = 12
#: How many of an ambiguous prefix's matches ``find`` names.
_SHOWN = 4


class Row:
    """One listed entry with its decoded record (``{}`` for raw and signed entries)."""

    __slots__ = ("info", "kind", "record")

    def __init__(self, info: EntryInfo, record: dict[str, Any] | None) -> None:
        self.info = info
        self.record = record or {}
        if record:
            self.kind = self.record.get("kind", "raw")
        else:
            from cuforge.storage.signing import is_signed

            self.kind = SIGNED if is_signed(info.meta) else "raw"

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def compiler(self) -> str:
        return str(self.record.get("compiler", ""))

    def as_dict(self) -> dict[str, Any]:
        """A JSON-able summary (``cache ls --json``)."""
        r = self.record
        return {
            "id": self.id,
            "kind": self.kind,
            "size": self.info.size,
            "stored": self.info.stored_ns / 1e9,
            "last_used": self.info.used_ns / 1e9,
            "name": r.get("name"),
            "code_type": r.get("code_type"),
            "target": r.get("target"),
            "arch": r.get("arch"),
            "compiler": r.get("compiler"),
        }


def rows(cache: ProgramCacheResource) -> list[Row]:
    """Every entry of ``cache``; UsageError when the backend cannot list entries."""
    from cuforge.storage.record import decode_record

    try:
        return [Row(info, decode_record(info.meta)) for info in cache.iter_entries()]
    except NotImplementedError as exc:
        raise UsageError(str(exc)) from None


def find(cache: ProgramCacheResource, prefix: str) -> Row:
    """The one entry whose id starts with ``prefix`` (UsageError: none or several)."""
    wanted = prefix.strip().lower()
    if not wanted or any(c not in "0123456789abcdef" for c in wanted):
        raise UsageError(f"{prefix!r} is not an entry id prefix (hex digits, from cache ls)")
    matches = [r for r in rows(cache) if r.id.startswith(wanted)]
    if not matches:
        raise UsageError(f"no entry id starts with {wanted}")
    if len(matches) > 1:
        shown = ", ".join(r.id[:SHORT] for r in matches[:_SHOWN])
        more = ", ..." if len(matches) > _SHOWN else ""  # only when some are not shown
        raise UsageError(
            f"{wanted} matches {len(matches)} entries ({shown}{more}): give more digits"
        )
    return matches[0]


def _compiler_parts(text: str) -> tuple[str, str, str]:
    """(name, version, first build id in full) of a record's compiler string
    (``nvrtc:13.5|build-id:feebac3b...|build-id:...|headers:...``); empty where absent."""
    name = version = build = ""
    for part in text.split("|"):
        if part.startswith("build-id:") and not build:
            build = part[len("build-id:") :].lower()
        elif ":" in part and not version and not part.startswith(("headers:", "build-id:")):
            name, _, rest = part.partition(":")
            version = rest.split(":")[0]
    return name, version, build


def short_compiler(text: str) -> str:
    """``nvrtc:13.5|build-id:feebac3b...|...`` -> ``nvrtc 13.5 feebac3b``: what ``ls``,
    ``show`` and ``prune`` print, and what ``prune --compiler`` matches."""
    if not text:
        return "-"
    name, version, build = _compiler_parts(text)
    described = " ".join(p for p in (f"{name} {version}" if name else "", build[:8]) if p)
    return described or text[:24]


#: The compiler names a description starts with (``driver``: the driver's PTX JIT).
COMPILER_NAMES = ("nvrtc", "nvjitlink", "nvvm", "driver")
_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)*")
_BUILD = re.compile(r"[0-9a-f]{6,40}")


def _split_named(word: str) -> list[str]:
    name, colon, version = word.partition(":")
    return [name, version] if colon and name in COMPILER_NAMES and version else [word]


def _matches(part: str, which: int, word: str) -> bool:
    if which == 0:
        return part.lower() == word
    if which == 2:
        return part.startswith(word)
    wanted = word.split(".")  # a version: a dotted prefix
    return part.split(".")[: len(wanted)] == wanted


def compiler_matcher(wanted: str, flag: str = "--compiler") -> Callable[[str], bool]:
    """A test of a record's compiler string against ``wanted``, a description as ``ls``
    prints it or a part of one: every word must match -- a compiler name (``nvrtc``)
    exactly, a version as a dotted prefix (``13`` matches 13.5, ``13.5`` matches 13.5,
    neither matches 12.9 or 3.1; ``nvrtc:13.5`` is both), or a build id by its first
    6 or more hex digits.
    UsageError naming ``flag`` for a word that is none of these (``build-id``,
    ``headers``, ``|``: parts of the raw string, which once matched every entry)."""
    # "nvrtc:13.5", as the raw string spells it, is the name and the version
    words = [w for part in wanted.lower().split() for w in _split_named(part)]
    if not words:
        raise UsageError(
            f"{flag} needs a build to match (13.5, nvrtc 13.5, a build id); it was empty"
        )
    tests: list[tuple[int, str]] = []  # (which part: 0 name, 1 version, 2 build; word)
    for word in words:
        if word in COMPILER_NAMES:
            tests.append((0, word))
        elif _BUILD.fullmatch(word):  # 6+ digits: no version is that long (driver: 13000)
            tests.append((2, word))
        elif _VERSION.fullmatch(word):
            tests.append((1, word))
        else:
            raise UsageError(
                f"{flag} {wanted!r}: {word!r} is not a compiler name "
                f"({', '.join(COMPILER_NAMES)}), a version (13, 13.5) or a build id "
                "(6 or more hex digits, as cache ls shows it)"
            )

    def matches(compiler: str) -> bool:
        parts = _compiler_parts(compiler)
        return bool(compiler) and all(_matches(parts[i], i, w) for i, w in tests)

    return matches


def manifest_entry_ids(data: bytes) -> list[str] | None:
    """The entry ids a header manifest's variants name (None: not a manifest)."""
    from cuforge.storage.entry import entry_id
    from cuforge.storage.record import decode_record

    record = decode_record(data, "manifest")
    if record is None or not isinstance(record.get("variants"), list):
        return None
    out = []
    for variant in record["variants"]:
        try:
            out.append(entry_id(bytes.fromhex(variant["key"])))
        except (KeyError, TypeError, ValueError):
            return None
    return out
