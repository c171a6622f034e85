"""A newcomer's pass over the README and docs (issue 36: every message true, one
meaning for every word). Each test runs the installed ``cuforge`` console script on
real caches filled by real NVRTC compiles.

- ``prune --compiler 12`` removed every CUDA 13.5 entry: it matched a substring of the
  raw compiler string (build ids hold "12"; ``build-id``, ``headers`` and ``|``
  matched everything) while the reason printed the description ``ls`` shows.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from _cli import SAXPY, one_line_error, run
from reliability._figures import record


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory cache holding saxpy for sm_80 and sm_90."""
    home = tmp_path_factory.mktemp("newcomer")
    result = run(home, "compile", str(SAXPY), "--arch", "sm_80,sm_90", "--outdir",
                 str(home / "out"), "--cache", str(home / "cache"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    return home / "cache"


@pytest.fixture
def cache(filled: Path, tmp_path: Path) -> Path:
    shutil.copytree(filled, tmp_path / "cache")
    return tmp_path / "cache"


def _ids(tmp_path: Path, cache: Path) -> list[str]:
    listed = run(tmp_path, "cache", "ls", "--json", "--cache", str(cache))
    assert listed.returncode == 0, listed.stderr
    return sorted(e["id"] for e in json.loads(listed.stdout))


# -- prune --compiler ----------------------------------------------------------------------
def test_prune_compiler_matches_the_description_ls_prints_not_the_raw_string(tmp_path, cache):
    """``--compiler 12`` selected every CUDA 13.5 entry (a build id holds "12"), and so
    did ``3``, ``build-id``, ``headers`` and ``|``: a substring of the raw string."""
    c = ("--cache", str(cache))
    listed = run(tmp_path, "cache", "ls", *c)
    described = {line.split("\t")[-1] for line in listed.stdout.splitlines()}
    assert len(described) == 1, listed.stdout  # both entries: one compiler
    (description,) = described
    name, version, build = description.split()  # "nvrtc 13.5 feebac3b", as ls prints it
    major = version.split(".")[0]
    before = _ids(tmp_path, cache)
    assert len(before) == 2

    other = "12" if major != "12" else "11"
    for wanted in (other, major[-1], f"{major}.{int(version.split('.')[1]) + 1}", "nvvm",
                   f"{other}.{version.split('.')[1]}", f"nvjitlink {version}"):  # fmt: skip
        pruned = run(tmp_path, "cache", "prune", "--compiler", wanted, "--json", *c)
        assert pruned.returncode == 0, (wanted, pruned.stderr)
        assert json.loads(pruned.stdout)["removed"] == [], wanted
        assert _ids(tmp_path, cache) == before, wanted
    for raw_part in ("build-id", "headers", "|", "build-id:", build[:4]):
        refused = run(tmp_path, "cache", "prune", "--compiler", raw_part, *c)
        line = one_line_error(refused, "cuforge cache prune")
        assert f"--compiler {raw_part!r}" in line and "a version (13, 13.5)" in line, line
        assert _ids(tmp_path, cache) == before, raw_part
    for wanted in (major, version, name, build, build[:6], f"{name} {version}", description,
                   f"{name}:{version}"):  # fmt: skip
        dry = run(tmp_path, "cache", "prune", "--compiler", wanted, "--dry-run", "--json", *c)
        assert dry.returncode == 0, (wanted, dry.stderr)
        reasons = {e["reason"] for e in json.loads(dry.stdout)["removed"]}
        assert reasons == {f"made by compiler {description}"}, (wanted, reasons)
        assert len(json.loads(dry.stdout)["removed"]) == 2, wanted
    assert _ids(tmp_path, cache) == before
    shown = run(tmp_path, "cache", "show", before[0][:12], *c).stdout
    (line,) = [ln for ln in shown.splitlines() if ln.startswith("compiler ")]
    assert line.split(None, 1)[1].startswith(f"{description} ("), line
    raw = json.loads(run(tmp_path, "cache", "ls", "--json", *c).stdout)[0]["compiler"]
    was = " and ".join(w for w in (other, major[-1]) if w in raw) + (
        " were" if other in raw else " was"
    )
    record(
        "inputs", "cli", f"cache prune --compiler on {description} entries: 6 other compilers "
        f"({other}, {major[-1]}, nvvm, ...), 5 parts of the raw string (build-id, headers, "
        "the bar, ...)", 11,
        f"0 entries removed (before: {was} substrings of the raw compiler string, removed "
        "both); the raw parts: exit 2, one line naming --compiler (before: "
        "each removed both); the description's words (13, 13.5, nvrtc, a build id prefix, "
        "the whole line) select exactly its entries", scale="all",
    )  # fmt: skip
