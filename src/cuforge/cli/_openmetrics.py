"""``cuforge cache stats --format openmetrics``: the counters in the OpenMetrics text
format (``application/openmetrics-text``, which Prometheus scrapes), for any
collector that runs a command or reads a file.

Every counter of ``CacheStats`` is a ``counter`` family (samples end in ``_total``; byte
counts carry ``# UNIT … bytes``); entries, size, disk use (where the cap bounds it:
SQLite) and cap are gauges, entries per kind one labelled gauge. Every sample is
labelled with the cache (as ``stats`` shows it, passwords hidden) and its backend;
label values are escaped as the format requires. The text ends with ``# EOF``. What
cannot be known (a backend that cannot list its entries) is left out, never written
as 0.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = ["render"]

# counter field -> (metric family, unit or "", help): every field of CacheStats
# (tests/test_cli_newcomer.py checks that none is left out)
_COUNTERS = {
    "hits": ("hits", "", "Lookups answered from the cache."),
    "misses": ("misses", "", "Lookups the cache could not answer."),
    "stores": ("stores", "", "Entries stored."),
    "evictions": ("evictions", "", "Entries evicted to stay under the size cap."),
    "integrity_failures": (
        "integrity_failures",
        "",
        "Damaged entries found on lookup (each a miss, never served).",
    ),
    "write_failures": ("write_failures", "", "Stores that failed (the compile went on)."),
    "bytes_read": ("read_bytes", "bytes", "Payload bytes served by hits."),
    "bytes_written": ("written_bytes", "bytes", "Payload bytes stored."),
    "signature_failures": (
        "signature_failures",
        "",
        "Entries refused because their signature did not verify.",
    ),
    "read_failures": ("read_failures", "", "Lookups that failed (a miss, the compile went on)."),
    "lock_timeouts": (
        "lock_timeouts",
        "",
        "Operations that gave up waiting for a lock another process held past the bound "
        "(a store skipped or kept, accounting or an eviction deferred).",
    ),
    "warm_compiles": (
        "warm_compiles",
        "",
        "Compiles made by processes that had declared themselves warm (cuforge.mark_warm).",
    ),
}

_PREFIX = "cuforge_cache_"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def render(report: Mapping[str, Any]) -> str:
    """The exposition for one ``stats`` report (the dict ``--json`` prints)."""
    base = {"cache": str(report["cache"]), "backend": str(report["backend"])}
    at = _labels(base)
    out: list[str] = []

    def family(name: str, kind: str, unit: str, text: str) -> str:
        full = _PREFIX + name
        out.append(f"# TYPE {full} {kind}")
        if unit:
            out.append(f"# UNIT {full} {unit}")
        out.append(f"# HELP {full} {text}")
        return full

    for field, (name, unit, text) in _COUNTERS.items():
        value = report.get(field)
        if value is None:
            continue
        full = family(name, "counter", unit, text + " Summed over every process that used it.")
        out.append(f"{full}_total{at} {int(value)}")
    if report.get("entries") is not None:
        full = family("entries", "gauge", "", "Entries in the cache now.")
        out.append(f"{full}{at} {int(report['entries'])}")
        kinds = report.get("kinds") or {}
        if kinds:
            full = family("kind_entries", "gauge", "", "Entries in the cache now, per kind.")
            for kind, n in sorted(kinds.items()):
                out.append(f"{full}{_labels({**base, 'kind': str(kind)})} {int(n)}")
    if report.get("size_bytes") is not None:
        full = family("size_bytes", "gauge", "bytes", "Bytes the entries take now.")
        out.append(f"{full}{at} {int(report['size_bytes'])}")
    if report.get("disk_bytes") is not None:
        full = family(
            "disk_bytes",
            "gauge",
            "bytes",
            "Bytes the cache's files take on disk (the cap bounds these).",
        )
        out.append(f"{full}{at} {int(report['disk_bytes'])}")
    if report.get("max_size_bytes"):
        full = family("max_size_bytes", "gauge", "bytes", "The size cap.")
        out.append(f"{full}{at} {int(report['max_size_bytes'])}")
    out.append("# EOF")
    return "\n".join(out) + "\n"
