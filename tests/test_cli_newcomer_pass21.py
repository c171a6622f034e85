"""Newcomer pass 21: a header-tracked kernel compiled with its ``-I`` directories in
another order. The compile served the entry the headers as they are key (a hit), but
``cache explain`` answered "miss" with reasons that never happened (``header
inc1/q.h deleted`` for a file that never existed) and ``cache stats`` counted the hit
as a miss. Through the installed ``cuforge`` console script, real NVRTC compiles."""

from __future__ import annotations

from pathlib import Path

from _cli import run


def _kernel(tmp_path: Path) -> Path:
    (tmp_path / "inc1").mkdir()
    (tmp_path / "inc2").mkdir()
    (tmp_path / "inc2" / "q.h").write_text("#define QV 10\n")
    source = tmp_path / "k.cu"
    source.write_text('#include <q.h>\nextern "C" __global__ void k(int* a) { *a = QV; }\n')
    return source


def _args(source: Path, out: str, cache: str, *dirs: str) -> list[str]:
    includes = [a for d in dirs for a in ("-I", str(source.parent / d))]
    return [str(source), "--arch", "sm_90", *includes, "--target", "ptx", "-o",
            str(source.parent / out), "--cache", cache]  # fmt: skip


def test_other_include_order_same_headers_is_a_hit_explained_and_counted_as_one(
    tmp_path: Path,
) -> None:
    source = _kernel(tmp_path)
    cache = str(tmp_path / "c")
    first = run(tmp_path, "compile", *_args(source, "a.ptx", cache, "inc1", "inc2"))
    assert first.returncode == 0 and "cache miss" in first.stdout, first.stderr
    swapped = _args(source, "b.ptx", cache, "inc2", "inc1")
    said = run(tmp_path, "cache", "explain", *swapped[:-4], *swapped[-2:])
    # before: exit 1, "miss: header .../inc1/q.h deleted" and "... now exists and shadows"
    assert said.returncode == 0, said.stdout + said.stderr
    assert said.stdout.startswith("hit: entry "), said.stdout
    again = run(tmp_path, "compile", *swapped, "-v")
    assert again.returncode == 0, again.stderr
    assert "cache hit" in again.stdout, again.stdout
    assert "deleted" not in again.stderr and " miss " not in again.stderr, again.stderr
    assert (tmp_path / "a.ptx").read_bytes() == (tmp_path / "b.ptx").read_bytes()
    stats = run(tmp_path, "cache", "stats", "--cache", cache).stdout
    # before: "0.0 % (0 hits / 2 lookups)", misses 2
    assert "hit rate            50.0 % (1 hit / 2 lookups)" in stats, stats
    assert "misses              1\n" in stats, stats


def test_other_include_order_through_a_tier_counts_the_hit_at_the_level_that_served(
    tmp_path: Path,
) -> None:
    source = _kernel(tmp_path)
    front, back = f"file://{tmp_path / 'front'}", f"file://{tmp_path / 'back'}"
    tier = f"{front},{back}"
    first = run(tmp_path, "compile", *_args(source, "a.ptx", tier, "inc1", "inc2"))
    assert first.returncode == 0 and "cache miss" in first.stdout, first.stderr
    again = run(tmp_path, "compile", *_args(source, "b.ptx", tier, "inc2", "inc1"))
    assert again.returncode == 0 and "cache hit" in again.stdout, again.stdout + again.stderr
    lines = {
        " ".join(ln.split()[:2]): ln
        for ln in run(tmp_path, "cache", "stats", "--cache", tier).stdout.splitlines()
        if ln.startswith("level ")
    }
    # the front (host) level served it; the request never reached the level behind
    assert lines["level 0"].endswith("hit rate 50.0 % (1 hit / 2 lookups that reached it)")
    assert lines["level 1"].endswith("hit rate 0.0 % (0 hits / 1 lookup that reached it)")
