"""``cuforge compile`` end to end, through ``python -m cuforge`` in a subprocess."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAXPY = ROOT / "examples" / "saxpy.cu"


def cuforge(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cuforge", *args], capture_output=True, text=True, cwd=cwd
    )


def test_compile_cubin_reports_output_and_time(tmp_path):
    out = tmp_path / "saxpy.cubin"
    result = cuforge("compile", str(SAXPY), "--arch", "sm_90", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:4] == b"\x7fELF"
    assert str(out) in result.stdout and " ms" in result.stdout
    assert "cubin" in result.stdout and "sm_90" in result.stdout


def test_compile_ptx_with_defines_includes_std(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "scale.cuh").write_text("#define SCALE 3\n")
    src = tmp_path / "k.cu"
    src.write_text(
        '#include "scale.cuh"\nextern "C" __global__ void k(int* p) { *p = SCALE * EXTRA; }\n'
    )
    result = cuforge(
        "compile", str(src), "--arch", "sm_90", "--target", "PTX",
        "-D", "EXTRA=5", "-I", str(tmp_path / "inc"), "--std", "c++17",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    ptx = (tmp_path / "k.ptx").read_text()  # default output: FILE.<target>
    assert ".entry k" in ptx and "15" in ptx


def test_compile_ltoir_and_ptx_input(tmp_path):
    ptx = tmp_path / "saxpy.ptx"
    made = cuforge("compile", str(SAXPY), "--arch", "sm_90", "--target", "ptx", "-o", str(ptx))
    assert made.returncode == 0, made.stderr
    result = cuforge("compile", str(ptx), "--arch", "sm_90")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "saxpy.cubin").read_bytes()[:4] == b"\x7fELF"
    out = tmp_path / "s.lto"
    lto = cuforge("compile", str(SAXPY), "--arch", "sm_90", "--target", "ltoir", "-o", str(out))
    assert lto.returncode == 0 and (tmp_path / "s.lto").stat().st_size > 0


def test_compile_error_exit_1_with_log(tmp_path):
    src = tmp_path / "bad.cu"
    src.write_text("__global__ void k() { missing(); }\n")
    result = cuforge("compile", str(src), "--arch", "sm_90")
    assert result.returncode == 1
    assert 'identifier "missing" is undefined' in result.stderr
    assert not (tmp_path / "bad.cubin").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arch", "sm90"], "ProgramOptions.arch"),
        (["--arch", "sm_90", "--std", "c++99"], "ProgramOptions.std"),
        (["--arch", "sm_90", "-D", "1BAD"], "ProgramOptions.define_macro"),
    ],
)
def test_bad_option_values_exit_2(args, message):
    result = cuforge("compile", str(SAXPY), *args)
    assert result.returncode == 2
    assert message in result.stderr


def test_usage_errors_exit_2(tmp_path):
    assert cuforge("compile", str(tmp_path / "missing.cu"), "--arch", "sm_90").returncode == 2
    assert cuforge("compile", str(SAXPY), "--target", "fatbin").returncode == 2
    assert cuforge().returncode == 2


def test_missing_arch_without_device_asks_for_arch():
    from cuforge.compile._versions import current_device_arch

    if current_device_arch() is not None:
        pytest.skip("a CUDA device is present, so --arch defaults to it")
    result = cuforge("compile", str(SAXPY))
    assert result.returncode == 2
    assert "--arch" in result.stderr


def test_main_is_importable_and_returns_int(tmp_path, capsys):
    from cuforge.cli import main

    assert main(["compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "o.cubin")]) == 0
    assert "o.cubin" in capsys.readouterr().out
