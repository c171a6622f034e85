"""CUDA headers out of the box: cuda_fp16.h, cuda_bf16.h, cuda::std and CUB compile
with no include options, through the cache too; the header sets are in the key.

Real NVRTC compiles against the header wheels cuforge depends on. Different header
sets are real directories too (a fake wheel or toolkit built from the real files,
with one thing changed); the only stand-in is one identity probe replaced to show
which keys it reaches. The gpu-marked tests run the kernels on the GPU machine and
compare with numpy.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cuforge import _cuda
from cuforge.compile import CompileError, Program, ProgramOptions, cache_key
from cuforge.compile.cache import _toolkit
from cuforge.storage import FileStreamProgramCache
from cuforge.utils import make_program_cache_key

ARCH = "sm_90"

HALF_SRC = r"""
#include <cuda_fp16.h>
extern "C" __global__ void half_fma(const __half* a, const __half* b, __half* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __hadd(__hmul(a[i], b[i]), __float2half(1.0f));
}
"""
BF16_SRC = r"""
#include <cuda_bf16.h>
extern "C" __global__ void bf16_fma(const __nv_bfloat16* a, const __nv_bfloat16* b,
                                    __nv_bfloat16* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] * b[i] + __float2bfloat16(0.5f);
}
"""
STD_SRC = r"""
#include <cuda/std/array>
#include <cuda/std/type_traits>
static_assert(cuda::std::is_same_v<cuda::std::remove_cv_t<const volatile int>, int>, "trait");
template <class T> __device__ T twice(T v) {
    static_assert(cuda::std::is_arithmetic_v<T>, "numbers only");
    return v + v;
}
extern "C" __global__ void array_sum(int* out) {
    cuda::std::array<int, 4> a{1, 2, 3, 4};
    int s = 0;
    for (int v : a) s += twice(v);
    out[0] = s + static_cast<int>(a.size());
}
"""
BLOCK = 256
CUB_SRC = r"""
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
constexpr int BLOCK = 256;
extern "C" __global__ void block_sum_scan(const int* in, int* sums, int* scans) {
    using Reduce = cub::BlockReduce<int, BLOCK>;
    using Scan = cub::BlockScan<int, BLOCK>;
    __shared__ typename Reduce::TempStorage reduce_tmp;
    __shared__ typename Scan::TempStorage scan_tmp;
    int i = blockIdx.x * BLOCK + threadIdx.x;
    int v = in[i];
    int total = Reduce(reduce_tmp).Sum(v);
    if (threadIdx.x == 0) sums[blockIdx.x] = total;
    int prefix;
    Scan(scan_tmp).InclusiveSum(v, prefix);
    scans[i] = prefix;
}
"""
SOURCES = {"half": HALF_SRC, "bfloat16": BF16_SRC, "cuda_std": STD_SRC, "cub": CUB_SRC}
KERNELS = {"half": "half_fma", "bfloat16": "bf16_fma", "cuda_std": "array_sum"}
KERNELS["cub"] = "block_sum_scan"


@pytest.fixture
def fresh_headers(monkeypatch):
    """Locate the headers anew for this test, and again (from the real environment)
    for whoever comes next."""
    monkeypatch.delenv(_toolkit.ENV_VAR, raising=False)
    _toolkit._reset()
    yield monkeypatch
    _toolkit._reset()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Each kernel compiled once through a FileStream cache (a miss), then again (a
    hit); the CUB compile (~2 s of NVRTC) is shared with the GPU tests."""
    _toolkit._reset()
    out = {}
    with FileStreamProgramCache(tmp_path_factory.mktemp("toolkit-cache")) as cache:
        for name, src in SOURCES.items():
            before = cache.stats()
            miss = Program(src, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=cache)
            hit = Program(src, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=cache)
            after = cache.stats()
            out[name] = (miss, hit, after.misses - before.misses, after.hits - before.hits)
    return out


def _key(src: str = HALF_SRC, **fields) -> bytes:
    return make_program_cache_key(
        code=src, code_type="c++", options=ProgramOptions(arch=ARCH, **fields), target_type="cubin"
    )


# -- out of the box ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_compiles_with_no_include_options_and_the_second_compile_is_a_hit(compiled, name):
    miss, hit, misses, hits = compiled[name]
    assert (misses, hits) == (1, 1)
    assert miss.code[:4] == b"\x7fELF" and KERNELS[name].encode() in miss.code
    assert hit.code == miss.code and hit.code_type == "cubin"


@pytest.mark.parametrize("name", ["half", "bfloat16"])
def test_uncached_compile_needs_no_include_options_either(compiled, name):
    obj = Program(SOURCES[name], "c++", ProgramOptions(arch=ARCH)).compile("cubin")
    assert obj.code == compiled[name][0].code


def test_the_default_sets_come_from_the_wheels_in_search_order(fresh_headers):
    report = _toolkit.toolkit_headers()
    assert [s.name for s in report.sets] == ["runtime", "crt", "cccl"] and not report.missing
    assert {s.source for s in report.sets} == {"wheel"}
    # The wheels of the bindings' major (13: nvidia-cuda-runtime, -crt, -cccl, all in
    # nvidia/cu13/include; 12: the -cu12 wheels, crt/ from nvcc's).
    wheels = [_cuda.header_wheel(s.name, _toolkit.CUDA_MAJOR) for s in report.sets]
    assert [s.package.split()[0] for s in report.sets] == [w.dist for w in wheels]
    for s, wheel in zip(report.sets, wheels, strict=True):
        assert any(s.directory.endswith(os.path.normpath(rel)) for rel in wheel.include_dirs)
    runtime, crt, cccl = (s.directory for s in report.sets)
    if _toolkit.CUDA_MAJOR == 13:
        assert runtime == crt and cccl == os.path.join(runtime, "cccl")
    dirs = tuple(dict.fromkeys((runtime, crt, cccl)))
    assert report.include_dirs == _toolkit.toolkit_include_dirs() == dirs
    assert _toolkit.toolkit_include_flags() == tuple(f"--include-path={d}".encode() for d in dirs)
    # A readable report, reachable from cuforge.utils.
    from cuforge import utils

    text = str(utils.toolkit_headers())
    for s in report.sets:
        assert s.name in text and s.package in text and s.directory in text
    assert report.sets[2].version.count(".") == 2  # CCCL's own version, e.g. 3.5.0


def test_a_user_header_of_the_same_name_on_include_path_wins(tmp_path):
    (tmp_path / "cuda_fp16.h").write_text(
        "#pragma once\n#define CUFORGE_USER_FP16 1\nstruct __half { unsigned short bits; };\n"
    )
    src = (
        "#include <cuda_fp16.h>\n#ifndef CUFORGE_USER_FP16\n"
        '#error "the toolkit header was found first"\n#endif\n'
        'extern "C" __global__ void k(__half* p) { p->bits = 1; }\n'
    )
    obj = Program(src, "c++", ProgramOptions(arch=ARCH, include_path=[tmp_path])).compile("cubin")
    assert obj.code[:4] == b"\x7fELF"
    # Without the user's directory, the toolkit's header is found: the check can fail.
    with pytest.raises(CompileError, match="the toolkit header was found first"):
        Program(src, "c++", ProgramOptions(arch=ARCH)).compile("cubin")
    # The user's directories come first in NVRTC's flags, the toolkit's last.
    with pytest.raises(CompileError) as info:
        opts = ProgramOptions(arch=ARCH, include_path=[tmp_path])
        Program("#error stop\n", "c++", opts).compile("cubin")
    flags = [f for f in info.value.options if f.startswith("--include-path=")]
    assert flags[0] == f"--include-path={tmp_path}"
    assert tuple(flags[1:]) == tuple(f"--include-path={d}" for d in _toolkit.toolkit_include_dirs())


# -- the header sets in the key ---------------------------------------------------------


def test_the_header_identity_reaches_cpp_keys_only(monkeypatch):
    ptx = "// ptx\n.version 8.0\n.target sm_90\n.address_size 64\n"
    keys = lambda: (  # noqa: E731
        _key(),
        make_program_cache_key(
            code=ptx, code_type="ptx", options=ProgramOptions(arch=ARCH), target_type="cubin"
        ),
    )
    before = keys()
    monkeypatch.setattr(cache_key._toolkit, "toolkit_identity", lambda: b"other headers")
    after = keys()
    assert after[0] != before[0] and after[1] == before[1]
    monkeypatch.undo()
    assert keys() == before


CCCL_WHEEL = _cuda.header_wheel("cccl", _toolkit.CUDA_MAJOR)
CCCL_INFO = CCCL_WHEEL.dist.replace("-", "_") + "-"


def _real_cccl_wheel() -> tuple[str, str, str, str]:
    """(header directory, site directory, dist-info name, site-relative header
    directory) of the installed CCCL wheel."""
    real = next(s for s in _toolkit.toolkit_headers().sets if s.name == "cccl")
    assert real.source == "wheel"
    # <site>/nvidia/cu13/include/cccl or <site>/nvidia/cuda_cccl/include -> <site>
    rel = next(r for r in CCCL_WHEEL.include_dirs if real.directory.endswith(os.path.normpath(r)))
    site_dir = real.directory[: -len(os.path.normpath(rel))].rstrip(os.sep)
    info = next(n for n in os.listdir(site_dir) if n.startswith(CCCL_INFO))
    return real.directory, site_dir, info, rel


def _fake_wheel_site(where, real, version: str, record_edit=None):
    """A site directory holding a copy of the CCCL wheel's metadata, installed as
    ``version``, whose header directory links the real one."""
    directory, site_dir, info, rel = real
    with open(os.path.join(site_dir, info, "RECORD"), encoding="utf-8") as f:
        record = f.read()
    if record_edit:
        record = record_edit(record)
    site = where / "site"
    fake_info = site / f"{CCCL_INFO}{version}.dist-info"
    fake_info.mkdir(parents=True)
    (fake_info / "RECORD").write_text(record)
    include = site / rel
    include.parent.mkdir(parents=True)
    include.symlink_to(directory)
    return str(site)


def test_a_different_cccl_wheel_changes_the_key_and_its_location_does_not(fresh_headers, tmp_path):
    base_key, base_ident = _key(), _toolkit.toolkit_identity()
    real = _real_cccl_wheel()
    real_version = real[2].removeprefix(CCCL_INFO).removesuffix(".dist-info")

    site = _fake_wheel_site(tmp_path / "a", real, "99.0.0")
    fresh_headers.syspath_prepend(site)
    _toolkit._reset()
    cccl = _toolkit.toolkit_headers().sets[2]
    assert cccl.package == f"{CCCL_WHEEL.dist} 99.0.0" and cccl.directory.startswith(site)
    assert _key() != base_key  # an upgrade is a miss

    # The same wheel (version and file hashes) somewhere else: the same key.
    site = _fake_wheel_site(tmp_path / "b", real, real_version)
    fresh_headers.syspath_prepend(site)
    _toolkit._reset()
    assert _toolkit.toolkit_headers().sets[2].directory.startswith(site)
    assert _toolkit.toolkit_identity() == base_ident and _key() == base_key

    # One header's hash differs in the wheel's RECORD: another key.
    def edit(record: str) -> str:
        lines = record.splitlines()
        i = next(i for i, line in enumerate(lines) if "/cuda/std/version," in line)
        path, _, size = lines[i].split(",")
        lines[i] = f"{path},sha256=changed,{size}"
        return "\n".join(lines)

    fresh_headers.syspath_prepend(_fake_wheel_site(tmp_path / "c", real, real_version, edit))
    _toolkit._reset()
    assert _toolkit.toolkit_headers().sets[2].package == f"{CCCL_WHEEL.dist} {real_version}"
    assert _key() != base_key


def _fake_toolkit(tmp_path):
    """A toolkit root whose include/ links the wheels' headers (runtime and crt/ in
    include/, CCCL in include/cccl), except a private copy of cuda_runtime_api.h
    (to edit)."""
    found = {s.name: s.directory for s in _toolkit.toolkit_headers().sets}
    include = tmp_path / "cuda" / "include"
    include.mkdir(parents=True)
    for directory in dict.fromkeys((found["runtime"], found["crt"])):
        for name in os.listdir(directory):
            if name not in ("cuda_runtime_api.h", "cccl") and not (include / name).exists():
                (include / name).symlink_to(os.path.join(directory, name))
    shutil.copy(os.path.join(found["runtime"], "cuda_runtime_api.h"), include)
    (include / "cccl").symlink_to(found["cccl"])
    return tmp_path / "cuda"


def test_a_toolkit_named_by_the_environment_is_used_and_its_headers_are_keyed(
    fresh_headers, tmp_path
):
    root = _fake_toolkit(tmp_path)
    wheel_key = _key()
    fresh_headers.setenv(_toolkit.ENV_VAR, str(root))
    _toolkit._reset()
    report = _toolkit.toolkit_headers()
    assert report.mode == "toolkit" and {s.source for s in report.sets} == {_toolkit.ENV_VAR}
    assert report.include_dirs == (str(root / "include"), str(root / "include" / "cccl"))
    k1 = _key()
    assert k1 != wheel_key
    obj = Program(HALF_SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin")
    assert b"half_fma" in obj.code

    # A changed version header in that toolkit is another key.
    api = root / "include" / "cuda_runtime_api.h"
    text = api.read_text(encoding="latin-1")
    version = report.sets[0].version
    assert version and "#define CUDART_VERSION" in text
    api.write_text(text.replace("#define CUDART_VERSION", "#define CUDART_VERSION 99990 //"))
    _toolkit._reset()
    assert _toolkit.toolkit_headers().sets[0].version == "99.99"
    assert _key() != k1


@pytest.mark.parametrize("value", ["0", "off", "NONE"])
def test_the_environment_turns_the_headers_off(fresh_headers, value):
    on_key = _key()
    fresh_headers.setenv(_toolkit.ENV_VAR, value)
    _toolkit._reset()
    assert _toolkit.toolkit_include_dirs() == () and _toolkit.toolkit_include_flags() == ()
    assert _toolkit.toolkit_identity() == b"toolkit-headers:none"
    assert _toolkit.toolkit_headers().mode == "off"
    assert _key() != on_key
    with pytest.raises(CompileError, match=r"cuda_fp16\.h") as info:
        Program(HALF_SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin")
    assert not any(f.startswith("--include-path") for f in info.value.options)


def test_a_directory_without_a_toolkit_is_a_clear_error(fresh_headers, tmp_path):
    fresh_headers.setenv(_toolkit.ENV_VAR, str(tmp_path))
    _toolkit._reset()
    expected = f"{_toolkit.ENV_VAR}=.*no cuda_runtime.h under .*set it to a CUDA toolkit root"
    with pytest.raises(ValueError, match=expected):
        _key()
    with pytest.raises(ValueError, match=expected):
        Program(HALF_SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin")


def test_without_wheels_on_sys_path_cuda_pathfinder_decides(fresh_headers):
    from cuda.pathfinder import find_nvidia_header_directory

    hidden = [p for p in sys.path if not os.path.isdir(os.path.join(p, "nvidia"))]
    fresh_headers.setattr(sys, "path", hidden)
    _toolkit._reset()
    report = _toolkit.toolkit_headers()
    # Here pathfinder finds the wheels in site-packages (its first step) by itself.
    runtime = find_nvidia_header_directory("cudart")
    assert runtime, "cuda.pathfinder should find the runtime headers here"
    found = {s.name: s for s in report.sets}
    assert found["runtime"].directory == os.path.abspath(runtime)
    assert found["runtime"].source not in ("wheel", "")
    cccl = find_nvidia_header_directory("cccl")
    assert (found["cccl"].directory if "cccl" in found else None) == (
        os.path.abspath(cccl) if cccl else None
    )


def test_the_identity_is_the_same_in_a_fresh_process(fresh_headers):
    code = "from cuforge.compile.cache import _toolkit; print(_toolkit.toolkit_identity().hex())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert bytes.fromhex(out.stdout.strip()) == _toolkit.toolkit_identity()


def test_locating_reads_few_files_and_a_hit_reads_none(fresh_headers):
    calls = []

    def counting(fn):
        def wrapper(*args, **kwargs):
            calls.append(fn.__name__)
            return fn(*args, **kwargs)

        return wrapper

    for mod, name in [(os, "stat"), (os, "scandir"), (os, "listdir"), (builtins, "open")]:
        fresh_headers.setattr(mod, name, counting(getattr(mod, name)))
    _toolkit._reset()
    _key()
    # CCCL alone has thousands of files; locating all three sets touches a few dozen.
    assert 0 < len(calls) < 100, calls

    def refuse(*args, **kwargs):
        raise AssertionError("the hit path touched the file system")

    for mod, name in [(os, "stat"), (os, "scandir"), (os, "listdir"), (builtins, "open")]:
        fresh_headers.setattr(mod, name, refuse)
    assert len(_key(HALF_SRC + "// another source\n")) == 32


# -- the README's example ---------------------------------------------------------------

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture(scope="module")
def readme_example(tmp_path_factory):
    """The README's CUDA-headers example, run as written twice (in a private default
    cache directory): the namespace of the first run, the second's stats and output."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    (example,) = [b for b in blocks if "cub/block" in b]
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))
    try:
        first: dict = {}
        exec(compile(example, "README.md", "exec"), first)
        second: dict = {}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(example, "README.md", "exec"), second)
        from cuforge.utils import FileStreamProgramCache

        with FileStreamProgramCache() as cache:
            totals = cache.total_stats()
    finally:
        mp.undo()
    return first, second, totals, out.getvalue()


def test_readme_example_compiles_with_no_include_options_then_hits(readme_example):
    first, second, totals, printed = readme_example
    assert first["obj"].code[:4] == b"\x7fELF" and b"half_sum" in first["obj"].code
    assert second["obj"].code == first["obj"].code
    assert (totals.misses, totals.hits) == (1, 1)
    assert "cccl" in printed and "runtime" in printed


# -- on the GPU: the kernels run and match numpy ----------------------------------------


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """Values (float64 or float32) -> bfloat16 bit patterns, rounded to nearest even
    in one step (8 significant bits; these values are far from bfloat16's limits)."""
    m, e = np.frexp(np.asarray(x, dtype=np.float64))
    rounded = np.ldexp(np.rint(m * 256) / 256, e).astype(np.float32)  # exact in float32
    return (rounded.view(np.uint32) >> 16).astype(np.uint16)


def _bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _run(obj, kernel, grid, block, inputs, outputs, extra=()):
    """Copy ``inputs`` to the device, launch ``kernel`` with them, then one buffer per
    output (dtype, count), then ``extra``; return the outputs as numpy arrays."""
    from cuda.bindings import driver

    from cuforge import Device, LaunchConfig, launch

    dev = Device()
    dev.set_current()
    stream = dev.create_stream()
    bufs = []
    for array in inputs:
        buf = dev.allocate(array.nbytes, stream=stream)
        stream.sync()
        assert driver.cuMemcpyHtoD(buf.handle, array.ctypes.data, array.nbytes)[0] == 0
        bufs.append(buf)
    outs = [dev.allocate(np.dtype(dt).itemsize * n, stream=stream) for dt, n in outputs]
    launch(
        stream, LaunchConfig(grid=grid, block=block), obj.get_kernel(kernel), *bufs, *outs, *extra
    )
    stream.sync()
    results = []
    for (dt, n), buf in zip(outputs, outs, strict=True):
        host = np.empty(n, dtype=dt)
        assert driver.cuMemcpyDtoH(host.ctypes.data, buf.handle, host.nbytes)[0] == 0
        results.append(host)
    for buf in bufs + outs:
        buf.close()
    stream.close()
    return results


@pytest.fixture(scope="module")
def gpu_objects(compiled):
    """The module's cubins where the device is sm_90, else compiled for the device."""
    from cuforge import Device

    arch = f"sm_{Device(0).arch}"
    if arch == ARCH:
        return {name: miss for name, (miss, *_) in compiled.items()}
    opts = ProgramOptions(arch=arch)
    return {name: Program(src, "c++", opts).compile("cubin") for name, src in SOURCES.items()}


@pytest.mark.gpu
def test_half_kernel_matches_numpy(gpu_objects):
    rng = np.random.default_rng(17)
    n = 10_001
    a = rng.uniform(-2, 2, n).astype(np.float16)
    b = rng.uniform(-2, 2, n).astype(np.float16)
    args = (gpu_objects["half"], "half_fma", (n + 255) // 256, 256, [a, b], [(np.float16, n)])
    (out,) = _run(*args, [np.int32(n)])
    # NVRTC may fuse __hmul and __hadd (one rounding) or not (two); the products and
    # sums are exact in float64, so both answers are known exactly.
    product = a.astype(np.float64) * b.astype(np.float64)
    fused = (product + 1).astype(np.float16)
    unfused = (product.astype(np.float16).astype(np.float64) + 1).astype(np.float16)
    assert np.all((out == fused) | (out == unfused))
    np.testing.assert_allclose(out.astype(np.float64), product + 1, rtol=0, atol=5e-3)


@pytest.mark.gpu
def test_bfloat16_kernel_matches_numpy(gpu_objects):
    rng = np.random.default_rng(18)
    n = 10_001
    a = _bf16_bits(rng.uniform(-2, 2, n))
    b = _bf16_bits(rng.uniform(-2, 2, n))
    args = (gpu_objects["bfloat16"], "bf16_fma", (n + 255) // 256, 256, [a, b])
    (out,) = _run(*args, [(np.uint16, n)], [np.int32(n)])
    product = _bf16_values(a).astype(np.float64) * _bf16_values(b).astype(np.float64)
    fused = _bf16_bits(product + 0.5)
    unfused = _bf16_bits(_bf16_values(_bf16_bits(product)).astype(np.float64) + 0.5)
    assert np.all((out == fused) | (out == unfused))
    np.testing.assert_allclose(_bf16_values(out), product + 0.5, rtol=0, atol=4e-2)


@pytest.mark.gpu
def test_readme_example_kernel_sums_halves(readme_example, gpu_objects):
    x = np.random.default_rng(20).uniform(-1, 1, 128).astype(np.float16)
    (out,) = _run(readme_example[0]["obj"], "half_sum", 1, 128, [x], [(np.float32, 1)])
    np.testing.assert_allclose(out[0], x.astype(np.float32).sum(), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_cub_block_reduce_and_scan_match_numpy(gpu_objects):
    rng = np.random.default_rng(19)
    blocks = 64
    data = rng.integers(-1000, 1000, blocks * BLOCK, dtype=np.int32)
    outputs = [(np.int32, blocks), (np.int32, data.size)]
    sums, scans = _run(gpu_objects["cub"], "block_sum_scan", blocks, BLOCK, [data], outputs)
    per_block = data.reshape(blocks, BLOCK)
    np.testing.assert_array_equal(sums, per_block.sum(axis=1))
    np.testing.assert_array_equal(scans, np.cumsum(per_block, axis=1).ravel())
