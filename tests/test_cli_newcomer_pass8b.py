"""The eighth newcomer pass, its second part (issue 36: every message true; the first
part is ``test_cli_newcomer_pass8.py``): each test runs the installed ``cuforge``
console script in a subprocess, on real caches with real NVRTC compiles (and a real
redis-server and SeaweedFS), and fails on the main it was written against.

- 3. a settings file's ``max_size`` stays in force after it is removed (the directory
  keeps the cap), and doctor named the cap's sources without the settings file.
- 5. ``CUFORGE_TOOLKIT_HEADERS=0 cuforge doctor`` printed no CUDA headers line at all.
- 6. an unreadable ``secret_file`` read ``PATH (not read: see the problem below)``, not
  ``not read from PATH (see the problem below)`` as the variable's file does.
- 7. ``cache stats`` of a Redis or S3 cache, which take no cap, said ``(no cap set)``.
"""

from __future__ import annotations

import json
from pathlib import Path

from _cli import SAXPY, isolated_env, run
from _redis import RedisServer


def _lines(text: str) -> dict[str, str]:
    """``label  value`` lines of a report by label (the first of each)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        label, value = line[:18].strip(), line[18:]
        found.setdefault(label, value)
    return found


# -- 3. a settings file's cap is kept by the cache, and doctor says who set it --------------
def test_a_settings_files_cap_outlives_it_and_doctor_names_the_settings_file(
    tmp_path: Path,
) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "saxpy.cu").write_text(SAXPY.read_text())
    settings = project / "cuforge.toml"
    settings.write_text('cache = "c"\narch = "sm_80"\nmax_size = "1K"\n')
    built = run(tmp_path, "compile", "saxpy.cu", "-o", "k.cubin", cwd=project)
    assert built.returncode == 0, built.stderr
    assert "not stored: larger than the cache's size cap" in built.stdout, built.stdout
    settings.write_text('cache = "c"\narch = "sm_80"\n')  # max_size removed
    cap_file = project / "c" / "cap"
    doctor = run(tmp_path, "doctor", cwd=project)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert _lines(doctor.stdout)["max size"] == (
        "1.0 KiB  (from the cache's cap file, set when the cache was opened with a cap: "
        "--max-size, ?max_size=, max_size in a settings file or max_size_bytes=; it stays "
        f"until a cap given again replaces it, or {cap_file} is removed)"
    ), doctor.stdout
    # as the line says: the cap is still obeyed ...
    again = run(tmp_path, "compile", "saxpy.cu", "-o", "k.cubin", cwd=project)
    assert "not stored: larger than the cache's size cap" in again.stdout, again.stdout
    # ... a cap given again replaces it, and cache prune --max-size leaves it alone
    bigger = run(tmp_path, "compile", "saxpy.cu", "-o", "k.cubin", "--max-size", "20M",
                 cwd=project)  # fmt: skip
    assert "compiled and stored" in bigger.stdout, bigger.stdout
    pruned = run(tmp_path, "cache", "prune", "--max-size", "1K", cwd=project)
    assert pruned.returncode == 0, pruned.stderr
    stats = json.loads(run(tmp_path, "cache", "stats", "--json", cwd=project).stdout)
    assert stats["max_size_bytes"] == 20 << 20, stats
    # ... and removing the file, as the line says, leaves no cap
    cap_file.unlink()
    stats = json.loads(run(tmp_path, "cache", "stats", "--json", cwd=project).stdout)
    assert stats["max_size_bytes"] is None, stats
    doctor = run(tmp_path, "doctor", cwd=project)
    assert _lines(doctor.stdout)["max size"] == "-  (not set)", doctor.stdout
    stored = run(tmp_path, "compile", "saxpy.cu", "-o", "k.cubin", cwd=project)
    assert "stored" in stored.stdout and "not stored" not in stored.stdout, stored.stdout


# -- 5. headers turned off: a line that says so, and which variable did it -----------------
def test_doctor_says_the_cuda_headers_are_off_and_names_the_variable(tmp_path: Path) -> None:
    for value in ("0", "off"):
        env = isolated_env(tmp_path, CUFORGE_TOOLKIT_HEADERS=value)
        doctor = run(tmp_path, "doctor", "--cache", str(tmp_path / "c"), env=env)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert _lines(doctor.stdout)["headers"] == (
            f"off ($CUFORGE_TOOLKIT_HEADERS={value}: C++ programs see only their own include paths)"
        ), doctor.stdout
        assert "headers runtime" not in doctor.stdout, doctor.stdout
        report = json.loads(run(tmp_path, "doctor", "--json", env=env).stdout)
        assert report["cuda_headers"] == [], report["cuda_headers"]
        assert report["cuda_headers_off"] == f"$CUFORGE_TOOLKIT_HEADERS={value}", report
    # auto: the sets, and no off line
    report = json.loads(run(tmp_path, "doctor", "--json").stdout)
    assert "cuda_headers_off" not in report, report
    assert sorted(h["set"] for h in report["cuda_headers"]) == ["cccl", "crt", "runtime"], report


# -- 6. a secret file not read: one wording, whichever named it -----------------------------
def test_doctor_says_not_read_from_path_for_a_settings_files_secret_file(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    toml = project / "cuforge.toml"
    toml.write_text('secret_file = "nothere"\n')
    missing = project / "nothere"
    doctor = run(tmp_path, "doctor", cwd=project)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    lines = _lines(doctor.stdout)
    assert lines["secret file"] == (
        f"not read from {missing} (see the problem below)  (from project config {toml})"
    ), doctor.stdout
    # the cache the rules chose (no setting names one: the default directory), refused
    # because of the secret, as compile is
    assert lines["cache"] == (
        "cannot be used (see the problem below)  (from the default cache directory)"
    ), doctor.stdout
    problem = f"secret_file {missing} (project config {toml}): No such file or directory"
    assert lines["problem"] == problem, doctor.stdout
    compiled = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_80", "-o", "k.cubin",
                   cwd=project)  # fmt: skip
    assert compiled.returncode == 2 and compiled.stderr.strip().endswith(problem), compiled.stderr
    # the same words as $CUFORGE_CACHE_SECRET_FILE's, for a file too short as well
    short = project / "short.key"
    short.write_text("abc")
    toml.write_text('secret_file = "short.key"\n')
    report = json.loads(run(tmp_path, "doctor", "--json", cwd=project).stdout)
    assert report["settings"]["secret_file"]["value"] == (
        f"not read from {short} (see the problem below)"
    ), report["settings"]
    env = isolated_env(tmp_path, CUFORGE_CACHE_SECRET_FILE=str(short))
    report = json.loads(run(tmp_path, "doctor", "--json", env=env).stdout)
    assert report["settings"]["secret"]["value"] == (
        f"not read from {short} (see the problem below)"
    ), report["settings"]


# -- 7. a cache that takes no cap: stats says what bounds it ----------------------------------
def test_stats_says_what_bounds_a_redis_or_s3_cache(
    tmp_path: Path, redis_server: RedisServer, s3_url: str
) -> None:
    redis = redis_server.url
    compiled = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_80", "-o",
                   str(tmp_path / "k.cubin"), "--cache", redis)  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr
    stats = run(tmp_path, "cache", "stats", "--cache", redis)
    assert stats.returncode == 0, stats.stderr
    lines = _lines_20(stats.stdout)
    assert lines["cache"] == f"{redis} (RedisProgramCache)", stats.stdout
    assert lines["entries"] == "1 (1 program)", stats.stdout
    no_cap = " (no cap: only the server's maxmemory, if it sets one, bounds it)"
    assert lines["size"].endswith(no_cap), stats.stdout
    tier = run(tmp_path, "cache", "stats", "--cache", f"memory://,{redis}")
    lines = _lines_20(tier.stdout)
    assert lines["level 0"].endswith(" (no cap set)"), tier.stdout  # memory:// takes one
    assert lines["level 1"].startswith(f"{redis} (RedisProgramCache): 1 entry, "), tier.stdout
    assert lines["level 1"].endswith(
        f"{no_cap}; hit rate 0.0 % (0 hits / 1 lookup that reached it)"
    ), tier.stdout
    # S3: a lifecycle rule or prune bounds it
    stats = run(tmp_path, "cache", "stats", "--cache", s3_url)
    assert stats.returncode == 0, stats.stderr
    size = _lines_20(stats.stdout)["size"]
    assert size.endswith(" (no cap: only a lifecycle rule or cuforge cache prune bounds it)"), size
    # a directory without a cap (the default one, not made yet): none set, as before
    plain = run(tmp_path, "cache", "stats")
    assert _lines_20(plain.stdout)["size"] == "0 B (no cap set)", plain.stdout


def _lines_20(text: str) -> dict[str, str]:
    """``cache stats`` lines (labels 20 wide) by label."""
    return {line[:20].strip(): line[20:] for line in text.splitlines()}
