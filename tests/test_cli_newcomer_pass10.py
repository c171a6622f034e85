"""The tenth newcomer pass (issue 36: every message true): each test runs the
installed ``cuforge`` console script in a subprocess on real caches and fails on the
main it was written against.

- 1. the commands that only look (``stats``, ``ls``, ``show``, ``verify``,
  ``explain``, ``doctor``) opened an SQLite cache with the cap of their URL or
  settings file and evicted down to it when they closed the handle: a cap below the
  cache's size deleted most of it, ``evictions`` staying 0.
"""

from __future__ import annotations

import json

from _cli import EXAMPLES, run

KERNELS = ["relu.cu", "transpose.cu", "histogram.cu", "scale.cu", "vector_add.cu"]


def _ids(tmp_path, url: str) -> list[str]:
    listed = run(tmp_path, "cache", "ls", "--cache", url, "--json")
    assert listed.returncode == 0, listed.stderr
    return sorted(e["id"] for e in json.loads(listed.stdout))


def test_commands_that_only_look_never_evict_from_an_sqlite_cache(tmp_path):
    db = tmp_path / "k.db"
    url = f"sqlite://{db}"
    sources = [str(EXAMPLES / "kernels" / k) for k in KERNELS]
    made = run(tmp_path, "compile", *sources, "--arch", "sm_90", "--outdir",
               str(tmp_path / "out"), "--cache", url)  # fmt: skip
    assert made.returncode == 0, made.stderr
    before = _ids(tmp_path, url)
    assert len(before) == len(KERNELS)
    small = f"{url}?max_size=72K"  # below what the cache holds: the smallest SQLite cap
    first = before[0][:12]
    looks = [
        ("cache", "ls", "--cache", small),
        ("cache", "stats", "--cache", small),
        ("cache", "stats", "--cache", small, "--json"),
        ("cache", "show", first, "--cache", small),
        ("cache", "verify", "--cache", small),
        ("cache", "explain", sources[0], "--arch", "sm_90", "--cache", small),
        ("doctor", "--cache", small),
    ]
    for args in looks:
        done = run(tmp_path, *args)
        assert done.returncode in (0, 1), (args, done.stderr)  # doctor: 1 for a cap note
        assert _ids(tmp_path, url) == before, args  # nothing evicted
    stats = json.loads(run(tmp_path, "cache", "stats", "--cache", url, "--json").stdout)
    assert stats["evictions"] == 0
    # a handle that writes still keeps the cap: the next compile through it evicts
    again = run(tmp_path, "compile", str(EXAMPLES / "saxpy.cu"), "--arch", "sm_90",
                "-o", str(tmp_path / "s.cubin"), "--cache", small)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert len(_ids(tmp_path, url)) < len(before)
