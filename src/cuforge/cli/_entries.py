"""The command line's view of cache entries: what each is, read from its metadata.

Every backend lists entries through ``ProgramCacheResource.iter_entries`` with their
metadata record (``cuforge.storage.record``): ``program`` entries (a compiled
binary: target, arch, source name, compiler build), ``manifest`` entries (header
manifests of tracked C++ compiles: which header versions made which entry), and
``raw`` entries stored by other code with no record.
"""

from __future__ import annotations

from cuforge.cli._args import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cuforge.storage.base import ProgramCacheResource
    from cuforge.storage.entry import EntryInfo

__all__ = ["Row", "find", "manifest_entry_ids", "rows", "short_compiler"]


class Row:
    """One listed entry with its decoded record (``{}`` for raw entries)."""

    __slots__ = ("info", "kind", "record")

    def __init__(self, info: EntryInfo, record: dict[str, Any] | None) -> None:
        self.info = info
        self.record = record or {}
        self.kind = self.record.get("kind", "raw") if record else "raw"

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
        shown = ", ".join(r.id[:16] for r in matches[:4])
        raise UsageError(f"{wanted} matches {len(matches)} entries ({shown}...): give more digits")
    return matches[0]


def short_compiler(text: str) -> str:
    """``nvrtc:13.5|build-id:feebac3b...|...`` -> ``nvrtc 13.5 feebac3b``."""
    if not text:
        return "-"
    version = build = ""
    for part in text.split("|"):
        if part.startswith("build-id:") and not build:
            build = part[len("build-id:") :][:8]
        elif ":" in part and not version and not part.startswith(("headers:", "build-id:")):
            name, _, rest = part.partition(":")
            version = f"{name} {rest.split(':')[0]}"
    return " ".join(p for p in (version, build) if p) or text[:24]


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
