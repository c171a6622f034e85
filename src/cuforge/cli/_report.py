"""What ``cuforge compile`` prints per output, shared by the full path and the fast
hit path (``_direct``) so both print exactly the same thing. Imports nothing heavy.

Text: one line per output::

    k.cu -> k.cubin (cubin, sm_90, 3720 bytes) in 0.9 ms, cache hit

``--json``: one array with an object per output: ``source``, ``arch``, ``target``,
``output``, ``bytes``, ``ms``, ``cache`` (``hit``, ``miss`` or ``off``), and
``error`` (the compiler log) for a failed compile.
"""

from __future__ import annotations

__all__ = ["CACHE_WORDS", "render"]

CACHE_WORDS = {"hit": ", cache hit", "miss": ", cache miss (compiled and stored)", "off": ""}


def render(results: list[dict], as_json: bool) -> str:
    """The text to print for ``results`` (dicts with the keys the module doc lists)."""
    if as_json:
        import json

        return json.dumps(results, indent=2)
    lines = []
    for r in results:
        if "error" in r:
            lines.append(f"{r['source']} ({r['target']}, {r['arch']}): compile failed")
            continue
        lines.append(
            f"{r['source']} -> {r['output']} ({r['target']}, {r['arch']}, {r['bytes']} bytes) "
            f"in {r['ms']:.1f} ms{CACHE_WORDS[r['cache']]}"
        )
    return "\n".join(lines)
