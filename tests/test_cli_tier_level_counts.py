"""``cuforge cache stats`` on a tier: each level's line counts the lookups that
reached it, through the real console script (a real Redis level, real compiles).

- A ``file://…,redis://…`` tier's front level missed a kernel the fleet level then
  served (handed over under the lock), and that miss went uncounted: a fresh file
  level whose only lookup Redis served read ``0 hits / 0 lookups that reached it``.
- A ``?ro`` level counts nothing (a read-only handle writes no counters), yet its
  line read ``0 hits / 1 lookup that reached it`` right after it served a hit.
"""

from __future__ import annotations

import json
from pathlib import Path

from _cli import SAXPY, run


def _levels(tmp_path: Path, tier: str) -> tuple[dict[str, str], list[dict[str, object]]]:
    """``cache stats``'s ``level N`` lines (text after the label) and ``--json`` levels."""
    text = run(tmp_path, "cache", "stats", "--cache", tier)
    assert text.returncode == 0, text.stderr
    lines = {
        " ".join(ln.split()[:2]): ln.split(None, 2)[2]
        for ln in text.stdout.splitlines()
        if ln.startswith("level ")
    }
    report = run(tmp_path, "cache", "stats", "--cache", tier, "--json")
    assert report.returncode == 0, report.stderr
    return lines, json.loads(report.stdout)["levels"]


def _compile(tmp_path: Path, arch: str, out: str, cache: str) -> str:
    result = run(tmp_path, "compile", str(SAXPY), "--arch", arch, "-o", str(tmp_path / out),
                 "--cache", cache)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def test_a_front_level_counts_the_miss_of_a_lookup_the_fleet_served(
    redis_server, tmp_path: Path
) -> None:
    fleet = redis_server.url
    _compile(tmp_path, "sm_90", "q.cubin", fleet)  # the entry only in Redis
    front = f"file://{tmp_path / 'tc'}"
    tier = f"{front},{fleet}"
    _compile(tmp_path, "sm_90", "q.cubin", tier)  # a local miss, served by Redis
    lines, levels = _levels(tmp_path, tier)
    said = lines["level 0"]  # before: "0 hits / 0 lookups that reached it"
    assert said.endswith("; hit rate 0.0 % (0 hits / 1 lookup that reached it)"), lines
    assert lines["level 1"].endswith("; hit rate 50.0 % (1 hit / 2 lookups that reached it)")
    _compile(tmp_path, "sm_80", "q.cubin", tier)  # a miss at both levels: compiled
    _compile(tmp_path, "sm_80", "q2.cubin", tier)  # a hit at the front level
    lines, levels = _levels(tmp_path, tier)
    # every one of the three lookups reached the front level; two reached the fleet's
    assert lines["level 0"].endswith("; hit rate 33.3 % (1 hit / 3 lookups that reached it)")
    assert lines["level 1"].endswith("; hit rate 33.3 % (1 hit / 3 lookups that reached it)")
    assert [(lv["hits"], lv["lookups"], lv["recorded"]) for lv in levels] == [
        (1, 3, True),
        (1, 3, True),
    ]


def test_a_read_only_levels_line_says_its_lookups_are_not_counted(tmp_path: Path) -> None:
    ci, local = f"file://{tmp_path / 'ci'}", f"file://{tmp_path / 'local'}"
    _compile(tmp_path, "sm_90", "a.cubin", ci)  # written by a writable handle: 1 miss
    _compile(tmp_path, "sm_80", "b.cubin", local)  # the local level exists: 1 miss
    tier = f"{ci}?ro,{local}"
    said = _compile(tmp_path, "sm_90", "a.cubin", tier)
    assert "cache hit" in said, said  # served by the ?ro level
    lines, levels = _levels(tmp_path, tier)
    assert "reached it" not in lines["level 0"], lines
    assert lines["level 0"].endswith(
        "; hit rate not recorded: opened read-only, lookups through it are not counted "
        "(its stored counters, from writable use: 0 hits / 1 lookup)"
    ), lines
    assert lines["level 1"].endswith("; hit rate 0.0 % (0 hits / 1 lookup that reached it)")
    assert [(lv["read_only"], lv["hits"], lv["lookups"], lv["recorded"]) for lv in levels] == [
        (True, 0, 1, False),
        (False, 0, 1, True),
    ]
    # the ?ro level behind: the counters stats shows are its own, not this tier's
    text = run(tmp_path, "cache", "stats", "--cache", f"{local},{ci}?ro")
    assert text.returncode == 0, text.stderr
    counters = next(ln for ln in text.stdout.splitlines() if ln.startswith("counters "))
    assert counters.split(None, 1)[1] == (
        f"level 1's ({ci}, read-only), summed over every process that used it writable: "
        "opened read-only, lookups through it are not counted"
    ), text.stdout


def _tracked(tmp_path: Path) -> Path:
    """A kernel that includes a header of its own: compiled through a manifest."""
    (tmp_path / "inc").mkdir(exist_ok=True)
    (tmp_path / "inc" / "scale.h").write_text("#define SCALE 3.0f\n")
    source = tmp_path / "scaled.cu"
    source.write_text(
        '#include "inc/scale.h"\n'
        'extern "C" __global__ void scaled(float* x) { x[threadIdx.x] *= SCALE; }\n'
    )
    return source


def _compile_tracked(tmp_path: Path, source: Path, cache: str) -> str:
    result = run(tmp_path, "compile", str(source), "--arch", "sm_90", "-o",
                 str(tmp_path / "s.cubin"), "--cache", cache)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def test_a_header_tracked_hit_counts_at_the_level_that_served_it(
    redis_server, tmp_path: Path
) -> None:
    # Before: a tracked program's lookups were made uncounted and its answer counted
    # on the tier only -- no level ever counted its hit ("0 hits" at the level that
    # served it, over Redis only the manifest's bytes read).
    source = _tracked(tmp_path)
    for n, back in enumerate((redis_server.url, f"file://{tmp_path / 'shared'}")):
        front = f"file://{tmp_path / f'front{n}'}"
        tier = f"{front},{back}"
        assert "cache miss" in _compile_tracked(tmp_path, source, back)  # only behind
        assert "cache hit" in _compile_tracked(tmp_path, source, tier)  # served behind
        lines, _ = _levels(tmp_path, tier)
        assert lines["level 0"].endswith("; hit rate 0.0 % (0 hits / 1 lookup that reached it)")
        assert lines["level 1"].endswith("; hit rate 50.0 % (1 hit / 2 lookups that reached it)")
        report = run(tmp_path, "cache", "stats", "--cache", tier, "--json")
        totals = json.loads(report.stdout)  # the counters are the widest level's
        assert totals["counters_level"] == 1 and totals["hits"] == 1, totals
        assert totals["bytes_read"] > 1000, totals  # the program's, not the manifest's 300 B
        assert "cache hit" in _compile_tracked(tmp_path, source, tier)  # served in front
        lines, _ = _levels(tmp_path, tier)
        assert lines["level 0"].endswith("; hit rate 50.0 % (1 hit / 2 lookups that reached it)")
        assert lines["level 1"].endswith("; hit rate 50.0 % (1 hit / 2 lookups that reached it)")
