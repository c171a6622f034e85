"""Newcomer pass 21, items 3-6: settings files checked wherever they are read,
doctor's cache line naming the file that could not be used, the refusal of
cuforge's own directory as a cache, and a signed entry served without a secret.
Through the installed ``cuforge`` console script, real NVRTC compiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _cli import SAXPY, isolated_env, one_line_error, run

LOOKS = "must look like 'sm_90' (or 'compute_90', with an optional 'a'/'f' suffix)"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No user settings file from the machine's HOME: only the project's."""
    return isolated_env(tmp_path, XDG_CONFIG_HOME=str(tmp_path / "config"), **extra)


def _project(tmp_path: Path, text: str) -> Path:
    work = tmp_path / "w"
    work.mkdir(exist_ok=True)
    (work / "cuforge.toml").write_text(text)
    return work


@pytest.mark.parametrize(
    ("written", "bad"),
    [('arch = "sm90"', "sm90"), ('arch = ["sm_90", "sm90"]', "sm90"), ('arch = "90"', "90")],
)
def test_an_arch_that_does_not_look_like_one_is_refused_also_under_arch(
    tmp_path: Path, written: str, bad: str
) -> None:
    work = _project(tmp_path, written + "\n")
    toml = work / "cuforge.toml"
    said = f"arch in project config {toml} {LOOKS}, got {bad!r}"
    for flags in (
        ("--arch", "sm_90"),
        ("--arch", "sm_90", "--cache", str(tmp_path / "c")),
        ("--arch", "sm_90", "--cache", str(tmp_path / "c"), "--max-size", "1G"),
        (),
    ):
        got = run(tmp_path, "compile", str(SAXPY), *flags, "-o", "x.cubin", cwd=work,
                  env=_env(tmp_path))  # fmt: skip
        assert one_line_error(got, "cuforge compile") == f"cuforge compile: error: {said}"
        assert not (work / "x.cubin").exists()
    got = run(tmp_path, "cache", "stats", "--cache", str(tmp_path / "c"), cwd=work,
              env=_env(tmp_path))  # fmt: skip
    assert one_line_error(got, "cuforge cache stats") == f"cuforge cache stats: error: {said}"
    doctor = run(tmp_path, "doctor", cwd=work, env=_env(tmp_path))
    assert doctor.returncode == 1, doctor.stderr
    problems = [line for line in doctor.stdout.splitlines() if line.startswith("problem")]
    assert [p.split(None, 1)[1] for p in problems] == [said], doctor.stdout


def test_an_arch_that_looks_like_one_is_refused_only_where_it_is_used(tmp_path: Path) -> None:
    # virtual, or one NVRTC does not compile for: a compile with --arch does not use it
    for written in ('arch = "compute_90"', 'arch = "sm_999"'):
        work = _project(tmp_path, written + "\n")
        out = work / "x.cubin"
        got = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(out),
                  cwd=work, env=_env(tmp_path))  # fmt: skip
        assert got.returncode == 0, got.stderr
        assert out.read_bytes()[:4] == b"\x7fELF"
        got = run(tmp_path, "compile", str(SAXPY), "-o", str(out), cwd=work, env=_env(tmp_path))
        assert f"in project config {work / 'cuforge.toml'}" in one_line_error(
            got, "cuforge compile"
        )


@pytest.mark.parametrize(
    "text",
    [
        'cach = "x"\n',
        "max_size = 20\n",
        "cache = 5\n",
        "arch = []\n",
        'cache = ""\n',
        "this is not TOML\n",
        'arch = "sm90"\n',
    ],
)
def test_doctor_names_the_settings_file_a_cache_could_not_be_chosen_from(
    tmp_path: Path, text: str
) -> None:
    work = _project(tmp_path, text)
    toml = work / "cuforge.toml"
    doctor = run(tmp_path, "doctor", cwd=work, env=_env(tmp_path))
    assert doctor.returncode == 1, doctor.stderr
    line = next(x for x in doctor.stdout.splitlines() if x.startswith("cache "))
    assert line.split(None, 1)[1] == (
        f"cannot be used (see the problem below)  (from project config {toml})"
    ), doctor.stdout
    assert any(x.startswith("problem") and str(toml) in x for x in doctor.stdout.splitlines()), (
        doctor.stdout
    )
    # --json: the same origin
    report = json.loads(run(tmp_path, "doctor", "--json", cwd=work, env=_env(tmp_path)).stdout)
    assert (report["cache"], report["origin"]) == ("invalid", f"project config {toml}"), report


def test_naming_cuforges_own_directory_as_the_cache_says_to_name_the_cache_inside(
    tmp_path: Path,
) -> None:
    made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
               str(tmp_path / "a.cubin"), env=_env(tmp_path))  # fmt: skip
    assert made.returncode == 0, made.stderr
    own = tmp_path / "xdg" / "cuforge"
    inner = own / "program-cache"
    assert (inner / "CACHEDIR.TAG").is_file()
    before = sorted(p.name for p in own.iterdir())
    got = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--cache", str(own), "-o",
              str(tmp_path / "z.cubin"), env=_env(tmp_path))  # fmt: skip
    assert one_line_error(got, "cuforge compile") == (
        f"cuforge compile: error: --cache: cache directory {own}: is not a cuforge cache "
        "(no CACHEDIR.TAG) and is not empty; cuforge creates and deletes files only in its "
        f"own caches; fix: name the cuforge cache inside it, {inner}"
    )
    got = run(tmp_path, "cache", "stats", "--cache", str(own), env=_env(tmp_path))
    assert one_line_error(got, "cuforge cache stats") == (
        f"cuforge cache stats: error: --cache: cache directory {own}: is not a cuforge cache "
        f"(no CACHEDIR.TAG) and is not empty; fix: name the cuforge cache inside it, {inner} "
        "(nothing was read or changed)"
    )
    assert sorted(p.name for p in own.iterdir()) == before
    # the cache it names works
    got = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--cache", str(inner), "-o",
              str(tmp_path / "z.cubin"), env=_env(tmp_path))  # fmt: skip
    assert got.returncode == 0 and "cache hit" in got.stdout, (got.stdout, got.stderr)
    # any other directory that is not a cache keeps the general fix
    other = tmp_path / "junk"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    got = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--cache", str(other), "-o",
              str(tmp_path / "z.cubin"), env=_env(tmp_path))  # fmt: skip
    assert one_line_error(got, "cuforge compile").endswith(
        "fix: name an empty or new directory for the cache"
    )


def test_a_signed_entry_is_served_unchecked_without_a_secret_as_documented(
    tmp_path: Path,
) -> None:
    cache = str(tmp_path / "c")
    secret = "s" * 32
    first, second = tmp_path / "s1.cubin", tmp_path / "s2.cubin"
    made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--cache", cache, "-o",
               str(first), env=_env(tmp_path, CUFORGE_CACHE_SECRET=secret))  # fmt: skip
    assert made.returncode == 0 and "cache miss" in made.stdout, made.stderr
    got = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--cache", cache, "-o",
              str(second), env=_env(tmp_path))  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.rstrip().endswith("cache hit"), got.stdout
    assert got.stderr == ""
    assert second.read_bytes() == first.read_bytes()
    verify = run(tmp_path, "cache", "verify", "--cache", cache, env=_env(tmp_path))
    assert verify.returncode == 0, verify.stderr
    assert "1 signed entry's signature was not checked (no secret set" in verify.stdout
    # and docs/cache.md's signing section says so (it was silent)
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "cache.md").read_text().split())
    assert "Without one, nothing checks a signature: a signed entry is served as any other" in doc
