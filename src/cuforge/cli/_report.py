"""What ``cuforge compile`` prints per output, shared by the full path and the fast
hit path (``_direct``) so both print exactly the same thing. Imports nothing heavy.

Text: one line per output::

    k.cu -> k.cubin (cubin, sm_90, 3720 bytes) in 0.9 ms, cache hit

``--json``: one array with an object per output: ``source``, ``arch``, ``target``,
``output``, ``bytes``, ``ms``, ``cache`` (``hit``, ``miss``, ``off`` -- no cache --
or, for the fatbin ``-o NAME.fatbin`` packs, ``packed``: it is not looked up, its
``parts`` are the outputs listed before it, each with its own ``cache``); on a miss
``stored`` (bool) and, when not stored, ``not_stored`` (why: ``read-only``,
``unreachable``, ``too-large``, ``locked``, ``failed``, ``compiler changed``);
``error`` (the compiler log) for a failed compile. A miss that was not stored reads
``cache miss (compiled; not stored: read-only)`` -- ``too-large`` reads "larger than
the cache's size cap" (``storage.events.dropped_words``).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["CACHE_WORDS", "render"]

CACHE_WORDS = {"hit": ", cache hit", "miss": ", cache miss (compiled and stored)", "off": ""}


def render(results: list[dict[str, Any]], as_json: bool) -> str:
    """The text to print for ``results`` (dicts with the keys the module doc lists)."""
    if as_json:
        import json

        return json.dumps(results, indent=2)
    lines = []
    for r in results:
        if "error" in r:
            lines.append(f"{r['source']} ({r['target']}, {r['arch']}): compile failed")
            continue
        if r["cache"] == "packed":
            words = f", packed from {r['parts']} parts"
        elif r.get("not_stored"):
            from cuforge.storage.events import dropped_words

            words = f", cache miss (compiled; not stored: {dropped_words(r['not_stored'])})"
        else:
            words = CACHE_WORDS[r["cache"]]
        lines.append(
            f"{r['source']} -> {r['output']} ({r['target']}, {r['arch']}, {r['bytes']} bytes) "
            f"in {r['ms']:.1f} ms{words}"
        )
    return "\n".join(lines)
