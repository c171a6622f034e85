"""What ``cuforge compile`` prints per output, shared by the full path and the fast
hit path (``_direct``) so both print exactly the same thing. Imports nothing heavy.

Text: one line per output (a control character in a name escaped, ``\\n``:
``cuforge._names.printed``; ``--json`` keeps the exact names)::

    k.cu -> k.cubin (cubin, sm_90, 3720 bytes) in 0.9 ms, cache hit

``--json``: one array with an object per output: ``source``, ``arch``, ``target``,
``output``, ``bytes``, ``ms``, ``cache`` (``hit``, ``miss``, ``off`` -- no cache --
or, for the fatbin ``-o NAME.fatbin`` packs, ``packed``: it is not looked up, its
``parts`` are the outputs listed before it, each with its own ``cache``); on a miss
``stored`` (bool: a level of the cache took it) and, when not stored, ``not_stored``
(why: ``read-only``, ``unreachable``, ``too-large``, ``locked``, ``failed``,
``compiler changed``); ``stored_in`` (the levels that took it, by URL, a password
shown as ``***``), ``outlives_process`` (whether one of them outlives this command:
not so for ``memory://``) and ``levels``: per level of the cache, ``level``,
``stored``, ``reason``, ``detail`` (the backend's words) and ``outlives_process``
(of the level, whether it stored or not); ``error`` (the compiler
log) for a failed compile, with ``refused`` (true) when nothing was compiled: the
cache refused the source (an include it cannot track; ``error`` says why and the way
out). Its text line reads ``m.cu (cubin, sm_90): refused, not compiled: ...``, not
``compile failed``.

A stored miss says where: ``cache miss (compiled and stored in /var/cache/cuforge)``,
naming a writable level that dropped it (``(redis://h:6379/0 unreachable: not stored
there)``); stored in ``memory://`` levels only, it reads ``cache miss (compiled;
stored in memory only: gone when this command exits)``. A miss that was not stored
reads ``cache miss (compiled; not stored: read-only)`` -- ``too-large`` reads
"larger than the cache's size cap" (``storage.events.dropped_words``).
"""

from __future__ import annotations

from cuforge._names import printed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["CACHE_WORDS", "MEMORY_ONLY", "REFUSED", "render", "store_fields"]

#: A source the cache refused (an include it cannot track): no compiler ran.
REFUSED = "refused, not compiled: the cache cannot track its includes (why: on stderr)"
CACHE_WORDS = {"hit": ", cache hit", "miss": ", cache miss (compiled and stored)", "off": ""}
#: A miss that only ``memory://`` levels took, in a process about to exit.
MEMORY_ONLY = "stored in memory only: gone when this command exits"


def store_fields(result: dict[str, Any], shown: list[tuple[str, bool]]) -> dict[str, Any]:
    """The report's store fields of a miss (module docstring) from a ``_pool`` result
    and the cache's levels as ``select.level_names`` shows them: (name, whether it
    lives in this process only). The per-level fields are left out when the result
    does not say what each level did (the compile refused to store: ``compiler
    changed``)."""
    out: dict[str, Any] = {"stored": bool(result.get("stored", False))}
    if not out["stored"]:
        out["not_stored"] = result.get("not_stored", "failed")
    done = result.get("store_levels") or []
    if len(done) != len(shown):
        return out
    levels = [
        {"level": name, "stored": reason == "stored", "reason": reason, "detail": detail,
         "outlives_process": not in_memory}
        for (name, in_memory), (reason, detail) in zip(shown, done, strict=True)
    ]  # fmt: skip
    out["stored_in"] = [lv["level"] for lv in levels if lv["stored"]]
    out["outlives_process"] = any(lv["stored"] and lv["outlives_process"] for lv in levels)
    out["levels"] = levels
    return out


def _miss_words(r: dict[str, Any]) -> str:
    """``, cache miss (...)``: where a miss was stored, or why not."""
    from cuforge.storage.events import dropped_words

    if r.get("not_stored"):
        return f", cache miss (compiled; not stored: {dropped_words(r['not_stored'])})"
    levels = r.get("levels")
    if levels is None:
        return CACHE_WORDS["miss"]
    lasting = [lv["level"] for lv in levels if lv["stored"] and lv["outlives_process"]]
    # A read-only level is never written, by design: not news, so not said.
    dropped = [
        f"{lv['level']} {dropped_words(lv['reason'])}: not stored there"
        for lv in levels
        if not lv["stored"] and lv["reason"] != "read-only"
    ]
    if lasting:
        words = f"compiled and stored in {', '.join(lasting)}"
    else:
        words = f"compiled; {MEMORY_ONLY}"
    return f", cache miss ({words}{' (' + '; '.join(dropped) + ')' if dropped else ''})"


def render(results: list[dict[str, Any]], as_json: bool) -> str:
    """The text to print for ``results`` (dicts with the keys the module doc lists)."""
    if as_json:
        import json

        return json.dumps(results, indent=2)
    lines = []
    for r in results:
        if "error" in r:
            what = REFUSED if r.get("refused") else "compile failed"
            lines.append(f"{r['source']} ({r['target']}, {r['arch']}): {what}")
            continue
        if r["cache"] == "packed":
            words = f", packed from {r['parts']} part{'' if r['parts'] == 1 else 's'}"
        elif r["cache"] == "miss":
            words = _miss_words(r)
        else:
            words = CACHE_WORDS[r["cache"]]
        lines.append(
            f"{r['source']} -> {r['output']} ({r['target']}, {r['arch']}, {r['bytes']} bytes) "
            f"in {r['ms']:.1f} ms{words}"
        )
    # A control character in a name (source, output, a level's directory) escaped:
    # one line per output, as promised.
    return "\n".join(printed(line) for line in lines)
