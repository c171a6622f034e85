"""An empty ``--arch`` (``--arch ''``, or an empty item: ``--arch sm_90,,``) is a usage
error naming ``--arch``, as ``--cache ''`` and ``-o ''`` are (docs/cli.md): it was
dropped, so ``compile`` then said "no CUDA device here ...; pass --arch sm_XY" (to a
user who had), or compiled for a settings file's arch, unsaid. Through the installed
``cuforge`` script; nothing is compiled, written or stored."""

from __future__ import annotations

import shutil

import pytest

from _cli import SAXPY, isolated_env, one_line_error, run

EMPTY = "--arch needs an architecture (it was given an empty one)"


@pytest.mark.parametrize("settings", [False, True], ids=["no settings", "arch in cuforge.toml"])
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--arch", ""), EMPTY),
        (("--arch", " "), EMPTY),
        (("--arch=",), EMPTY),
        (("--arch", "sm_90", "--arch", ""), EMPTY),
        (("--arch", "sm_90,,"), "--arch 'sm_90,,' has an empty item"),
        (("--arch", "sm_90,"), "--arch 'sm_90,' has an empty item"),
        (("--arch", ",sm_80"), "--arch ',sm_80' has an empty item"),
    ],
)
def test_an_empty_arch_is_a_usage_error(tmp_path, settings, args, said):
    shutil.copy(SAXPY, tmp_path / "saxpy.cu")
    if settings:
        (tmp_path / "cuforge.toml").write_text('arch = "sm_90"\n')
    env = isolated_env(tmp_path)
    cache = tmp_path / "cache"
    for command in (
        ("compile", "saxpy.cu", *args, "-o", str(tmp_path / "o.cubin"), "--cache", str(cache)),
        ("compile", "saxpy.cu", *args, "--no-cache"),
        ("cache", "explain", "saxpy.cu", *args),
    ):
        done = run(tmp_path, *command, cwd=tmp_path, env=env)
        prog = "cuforge " + " ".join(command[:2] if command[0] == "cache" else command[:1])
        line = one_line_error(done, prog)
        assert said in line, line
        assert "no CUDA device" not in line
    assert not (tmp_path / "o.cubin").exists() and not (tmp_path / "saxpy.cubin").exists()
    assert not cache.exists()


def test_archs_around_commas_still_compile(tmp_path):
    shutil.copy(SAXPY, tmp_path / "saxpy.cu")
    done = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_80, sm_90", "--outdir", "out",
               "--no-cache", cwd=tmp_path, env=isolated_env(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "saxpy.sm_80.cubin",
        "saxpy.sm_90.cubin",
    ]
