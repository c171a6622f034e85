"""Would this compile hit the cache? If not, which input changed?

:func:`explain` answers without compiling and without touching the cache's
statistics or its entries' use: entries are read as maintenance (by id, as ``cuforge
cache show`` reads them), so no access time or recency moves and an entry explain
looked at is not kept alive against ``prune --unused-for`` or eviction. For a C++
program that reads headers it checks the manifest's variants and names each header
that was edited, deleted or is now shadowed by a new file (or, under other include
directories, is found as another file than the one it found), against the variant these
headers differ from least (the newest among equals): only what stands between this
compile and a hit -- unless the headers as they are now key an entry that is there
(compiled under other include directories, or in another checkout): the compile
serves it, so that is a hit. When there is no
entry (or manifest) for these inputs at all, it compares them with the nearest entry
of the same source name (the one that differs in the fewest inputs) and names what
differs: the source, an option, the compiler build, target or arch, name
expressions, a header.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cuforge._names import printed
from cuforge.compile import _inputs as inputs
from cuforge.compile.cache import _manifest, _tracking
from cuforge.compile.cache._key import program_key
from cuforge.compile.cache._steps import peek_entry
from cuforge.compile.program import Program
from cuforge.compile.targets import normalize_target
from cuforge.storage import failopen
from cuforge.storage.base import ProgramCacheResource
from cuforge.storage.entry import entry_id
from cuforge.storage.record import decode_record

if TYPE_CHECKING:
    from cuforge.storage.protocol import ProgramCache

__all__ = ["Explanation", "explain"]


@dataclass
class Explanation:
    """The answer of :func:`explain`. ``str()`` gives one line per reason (a control
    character in a name, a header's newline, escaped: ``cuforge._names.printed``)."""

    hit: bool
    key: str  # the entry (or manifest) id the compile would look up
    reasons: list[str] = field(default_factory=list)
    nearest: str | None = None  # id of the entry the inputs were compared with

    def __str__(self) -> str:
        if self.hit:
            # 12 hex digits, as cache ls, the explain miss line and the logger show ids
            return f"hit: entry {self.key[:12]} would be served"
        lines = [f"miss: {printed(r)}" for r in self.reasons] or ["miss"]
        return "\n".join(lines)


def explain(
    program: Program,
    target_type: str,
    cache: ProgramCache,
    name_expressions: Iterable[str | bytes] = (),
) -> Explanation:
    """Whether ``program.compile(target_type, name_expressions, cache=cache)`` would hit,
    and if not, why.

    Nothing is compiled, stored or counted (the cache's hit/miss statistics are left
    as they were), and no entry's use time moves (maintenance reads). On a hit the
    :class:`Explanation` names the entry that would be served. On a miss its
    ``reasons`` name what changed: for a program that reads headers, each header
    edited, deleted or newly shadowed since the manifest's variants were recorded;
    otherwise the inputs that differ from the nearest entry of the same source name
    (``nearest``) -- source, an option, the compiler build, target, arch, name
    expressions -- or that no entry of that name exists.

    ``cache``: any ``ProgramCacheResource`` (``open_cache(url)`` for a URL). A cache
    that cannot be read counts as a miss; it never raises for that.
    Raises what ``Program.compile`` raises for bad arguments (TypeError/ValueError),
    and what ``compile(cache=)`` refuses on a miss: ``UntrackableInclude`` for an
    include it cannot track (docs/headers.md).
    """
    if not isinstance(program, Program):
        raise TypeError(f"program must be a cuforge Program, got {type(program).__name__}")
    target = normalize_target(program.code_type, target_type)
    names = inputs.name_tuple(program.code_type, name_expressions)
    inputs.check_target(program.options, target)
    resource = failopen.as_cache(cache)
    src = program.source
    roots = _tracking.roots_if_tracked(src) if src.code_type == "c++" else None
    if roots is not None:
        mkey = _tracking.manifest_key(src, target, names)
        variants = _tracking.lookup_manifest(resource, mkey, roots, peek=True)
        answer = (
            None if variants is None
            else _from_manifest(resource, variants, entry_id(mkey), roots, src.options)
        )  # fmt: skip
        if answer is not None and answer.hit:
            return answer
        # A miss resolves the headers, as compile(cache=) does on a miss: an include it
        # cannot track is refused here as there (UntrackableInclude), not explained;
        # and serves the entry those headers key when there is one (compiled under
        # other include directories, or in another checkout).
        deps = _tracking.resolve(src, roots)
        ekey = _tracking.entry_key(src, target, names, deps)
        if peek_entry(resource, ekey) is not None:
            return Explanation(True, entry_id(ekey))
        if answer is not None:
            return answer
        key = mkey
    else:
        key = program_key(src.code_type, target, src.options, src.code, names, None)
        entry = peek_entry(resource, key)
        if entry is not None:
            return Explanation(True, entry_id(key))
    return _nearest(resource, program, target, names, entry_id(key))


def _from_manifest(
    cache: ProgramCacheResource,
    variants: list[_manifest.Prepared],
    mid: str,
    roots: Any,
    options: Any,
) -> Explanation:
    evicted = False
    nearest: list[Any] | None = None  # the problems of the variant that differs least
    near: _manifest.Prepared | None = None
    for variant in variants:  # newest first: among equals, the newest is named
        problems = _manifest.check(variant, all_problems=True)
        if not problems:
            entry = peek_entry(cache, variant.key)
            if entry is not None:
                return Explanation(True, entry_id(variant.key))
            evicted = True
        elif nearest is None or len(problems) < len(nearest):
            nearest, near = problems, variant
    if evicted:
        return Explanation(
            False, mid, ["the headers match a compile whose entry is gone (evicted)"]
        )
    said = [str(p) for p in nearest or ()]
    if near is not None and any(p.what == "edited" for p in nearest or ()):
        said = _moved(cache, near, nearest or [], roots, list(options.include_path or ()))
    return Explanation(False, mid, said)


def _moved(
    cache: ProgramCacheResource, variant: Any, problems: list[Any], roots: Any, now: list[str]
) -> list[str]:
    """The problems in words, where an "edited" header is one an include directory
    now at the same position (the manifest records positions: ``-I dirA`` replaced by
    ``-I dirB``) finds instead of the file the entry read: said as found elsewhere
    (and whether the file it read was edited since), never as an edit of the new one."""
    from cuforge.compile.cache._includes import file_digest

    entry = peek_entry(cache, variant.key)
    record = decode_record(entry.meta, "program") if entry is not None else None
    was = list((record or {}).get("include_path") or [])
    out = []
    for problem in problems:
        out.append(str(problem))
        for i, (old_dir, new_dir) in enumerate(zip(was, now, strict=False)):
            prefix = os.path.join(roots.user[i], "")
            if old_dir == new_dir or not problem.path.startswith(prefix):
                continue
            rel = problem.path[len(prefix) :]
            old = os.path.join(roots.cwd, old_dir, rel)
            recorded = next((d for f, _, d in variant.files if f == problem.path), None)
            try:
                with open(old, "rb") as f:
                    also = "" if file_digest(f.read()) == recorded else ", itself edited since"
            except OSError:
                also = ", itself gone since"
            out[-1] = (
                f"header {rel} now found at {problem.path}, not at {old}{also} "
                f"(include directory {old_dir} is now {new_dir})"
            )
            break
    return out


def _program_records(
    cache: ProgramCacheResource, name: str, code_type: str
) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for info in cache.iter_entries():
        record = decode_record(info.meta, "program")
        if record and record.get("name") == name and record.get("code_type") == code_type:
            out.append((info.id, record))
    return out


def _nearest(
    cache: ProgramCacheResource,
    program: Program,
    target: str,
    names: tuple[str | bytes, ...],
    key_id: str,
) -> Explanation:
    name = program.options.name or ""
    try:
        candidates = _program_records(cache, name, program.code_type)
    except NotImplementedError:
        return Explanation(
            False, key_id, [f"no entry for these inputs ({type(cache).__name__} cannot list "
                            "entries to compare with)"],
        )  # fmt: skip
    if not candidates:
        return Explanation(False, key_id, [f"no entry for source name {name!r} in this cache"])
    current = _inputs(program, target, names)
    best: tuple[int, str, list[str]] | None = None
    for eid, record in candidates:
        diffs = _differences(current, record, lambda h, r=record: _header_change(program, r, h))
        if best is None or len(diffs) < best[0]:
            best = (len(diffs), eid, diffs)
    assert best is not None
    reasons = best[2] or ["an entry with the same inputs exists under another key (schema?)"]
    return Explanation(False, key_id, reasons, best[1])


def _inputs(program: Program, target: str, names: tuple[str | bytes, ...]) -> dict[str, Any]:
    from cuforge.compile.cache._records import program_record
    from cuforge.compile.object_code import ObjectCode

    options = program.options
    headers: list[list[str]] = []
    src = program.source
    roots = _tracking.roots_if_tracked(src) if src.code_type == "c++" else None
    if roots is not None:
        from cuforge.compile.cache import _includes

        try:
            deps = _includes.resolve(
                src.code, options.name or "<source>", roots,
                options.define_macro or (), options.pre_include or (),
            )  # fmt: skip
            headers = [list(h) for h in deps.header_digests()]
        except ValueError:
            headers = []
    fake = ObjectCode(b"\0", target, symbol_mapping={n: "" for n in names})
    record = decode_record(program_record(src, target, fake, names, None), "program")
    assert record is not None
    record["headers"] = headers
    return record


def _found_at(deps: Any, roots: Any, header: str) -> str | None:
    """The path of the one user file NVRTC is given as ``header`` (None: none, or no
    single file: the name is then said as it is)."""
    digest = deps.digests.get(header)
    at = {
        roots.path(f.pos, f.rel)
        for f in deps.files.values()
        if f.digest == digest and (f.rel == header or f.rel.endswith(os.sep + header))
    }
    return at.pop() if digest and len(at) == 1 else None


def _header_change(program: Program, then: dict[str, Any], header: str) -> str:
    """Why ``header`` gives NVRTC other bytes than the entry ``then`` recorded: under
    other include directories the name may find another file, the one it found before
    unchanged -- that is a newly shadowing file (or one found instead), not an edit.
    Resolved under the entry's include directories here and now; "edited" when the
    name finds the same file (or either search cannot tell one file)."""
    from cuforge.compile.cache import _includes

    src = program.source
    options = src.options
    was = list(then.get("include_path") or [])
    roots = _tracking.roots_if_tracked(src)
    if roots is None or was == list(options.include_path or ()):
        return f"header {header} edited"
    old_roots = _includes.Roots(
        roots.source, roots.cwd, tuple(os.path.join(roots.cwd, d) for d in was), roots.toolkit
    )
    found = []
    for where in (roots, old_roots):
        try:
            deps = _includes.resolve(
                src.code, options.name or "<source>", where,
                options.define_macro or (), options.pre_include or (),
            )  # fmt: skip
        except ValueError:
            return f"header {header} edited"
        found.append((_found_at(deps, where, header), deps.digests.get(header)))
    (new, _), (old, old_digest) = found
    if new is None or old is None or new == old:
        return f"header {header} edited"
    recorded = {h[0]: h[1] for h in then.get("headers") or []}.get(header)
    also = "" if old_digest == recorded else ", itself edited since"
    searched = {os.path.normpath(os.path.join(d, os.path.dirname(header)))
                for d in (roots.source, *roots.user) if d is not None}  # fmt: skip
    if os.path.dirname(old) in searched:  # a directory searched still: the new one is first
        return f"header {header} now found at {new}, which shadows {old}{also}"
    return f"header {header} now found at {new}, not at {old}{also}"


def _differences(now: dict[str, Any], then: dict[str, Any], header_change: Any = None) -> list[str]:
    out: list[str] = []
    if now.get("source") != then.get("source"):
        out.append("the source changed")
    for fieldname in ("target", "arch"):
        if now.get(fieldname) != then.get(fieldname):
            out.append(f"{fieldname} {then.get(fieldname)} -> {now.get(fieldname)}")
    if now.get("compiler") != then.get("compiler"):
        out.append(f"compiler build changed ({then.get('compiler')} -> {now.get('compiler')})")
    old_opts, new_opts = then.get("options") or [], now.get("options") or []
    # The arch is said once, above: a flag that differs only by it (the compiler's
    # --gpu-architecture=sm_80 for sm_75) is that change, not an option added and removed.
    was, became = str(then.get("arch") or ""), str(now.get("arch") or "")
    moved = was != became and bool(was) and bool(became)
    for flag in new_opts:
        if flag not in old_opts:
            if moved and became in flag and flag.replace(became, was) in old_opts:
                continue
            out.append(f"option {flag} added")
    for flag in old_opts:
        if flag not in new_opts:
            if moved and was in flag and flag.replace(was, became) in new_opts:
                continue
            out.append(f"option {flag} removed")
    old_names = {tuple(s[:2]) for s in then.get("symbols") or []}
    new_names = {tuple(s[:2]) for s in now.get("symbols") or []}
    if old_names != new_names:
        out.append("name expressions changed")
    old_h = {h[0]: h[1] for h in then.get("headers") or []}
    new_h = {h[0]: h[1] for h in now.get("headers") or []}
    for header in sorted(set(old_h) | set(new_h)):
        if header not in new_h:
            out.append(f"header {header} no longer included")
        elif header not in old_h:
            out.append(f"header {header} newly included")
        elif old_h[header] != new_h[header]:
            out.append(header_change(header) if header_change else f"header {header} edited")
    return out
