"""A newcomer pass (issue 36: every message true), branch idauth: each test runs the
installed ``cuforge`` console script in a subprocess on real caches (real NVRTC
compiles) and fails on the main it was written against.

- 1. ``print(toolkit_headers())`` said ``identity 7eee1002a103d503`` while ``cuforge
  cache show`` said ``...|headers:0efdc041c84f`` for an entry those very headers
  compiled (blake2b of 8 bytes against 6: neither a prefix of the other), so a user
  could not match an entry to its header set. Both print one digest now
  (``_toolkit.identity_digest``, the form entries already record; keys unchanged).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _cli import SAXPY, isolated_env, run

#: str() first: the digest is compared before the property is looked at.
REPORT = (
    "from cuforge.utils import toolkit_headers as t; r = t(); "
    "print(r, flush=True); print(r.identity_digest)"
)


# -- 1. one digest of the header set's identity ------------------------------------------
def test_toolkit_headers_prints_the_digest_an_entry_records(tmp_path: Path) -> None:
    cache = str(tmp_path / "c")
    made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90",
               "-o", str(tmp_path / "s.cubin"), "--cache", cache)  # fmt: skip
    assert made.returncode == 0, made.stderr
    listed = run(tmp_path, "cache", "ls", "--cache", cache)
    assert listed.returncode == 0, listed.stderr
    [row] = listed.stdout.splitlines()
    entry = row.split("\t")[0]
    shown = run(tmp_path, "cache", "show", entry, "--cache", cache)
    assert shown.returncode == 0, shown.stderr
    [compiler] = [ln for ln in shown.stdout.splitlines() if ln.startswith("compiler ")]
    report = subprocess.run([sys.executable, "-c", REPORT], capture_output=True, text=True,
                            env=isolated_env(tmp_path), timeout=240)  # fmt: skip
    [identity] = [ln.split()[1] for ln in report.stdout.splitlines()
                  if ln.startswith("  identity ")]  # fmt: skip
    # What a user greps for: the entry's recorded compiler names this header set.
    assert compiler.endswith(f"|headers:{identity})"), (compiler, report.stdout)
    assert report.returncode == 0, report.stderr
    assert report.stdout.splitlines()[-1] == identity  # the property is what str() prints
    as_json = run(tmp_path, "cache", "show", entry, "--cache", cache, "--json")
    assert json.loads(as_json.stdout)["compiler"].endswith(f"|headers:{identity}")
