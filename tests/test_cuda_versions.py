"""CUDA 12 and 13 from one code base (``cuforge._cuda``).

Runs in both venvs: ``make test`` (the default, CUDA 13) and ``make test-cu12``
(cuda-bindings 12.x and the -cu12 wheels). Tests that compare the two majors run a
real compile in the other venv, named by ``CUFORGE_OTHER_PYTHON`` (``make
test-cu12`` always sets it; ``make test`` sets it once .venv-cu12 exists); without
it they skip and say so. Environments without a compiler are real too: a venv
whose site-packages hold no NVRTC wheel, seeing this one's packages through a .pth.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import cuforge
from cuforge import _cuda
from cuforge.compile.cache import _toolkit

SRC_DIR = Path(cuforge.__file__).resolve().parent
OTHER = os.environ.get("CUFORGE_OTHER_PYTHON", "")
needs_other = pytest.mark.skipif(
    not (OTHER and os.path.exists(OTHER)),
    reason="CUFORGE_OTHER_PYTHON names no venv of the other CUDA major (make test-cu12 sets it)",
)
KERNEL = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n'


def _run(python: str, code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in ``python``; it prints one JSON object as its last line."""
    done = subprocess.run(
        [python, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_major_is_the_bindings_read_without_importing_them():
    got = _run(
        sys.executable,
        """
        import json, sys
        from cuforge import _cuda
        from cuforge.compile.cache import _toolkit
        version = _cuda.bindings_version()
        imported = "cuda.bindings" in sys.modules
        import cuda.bindings
        print(json.dumps([version, imported, cuda.bindings.__version__, _toolkit.CUDA_MAJOR]))
        """,
    )
    version, imported, real, toolkit_major = got
    assert not imported
    assert ".".join(map(str, version)) == ".".join(real.split(".")[:3])
    assert version[0] in _cuda.SUPPORTED_MAJORS and toolkit_major == version[0]


def test_the_header_wheels_are_the_bindings_majors():
    report = _toolkit.toolkit_headers()
    major = _cuda.cuda_major()
    assert [s.package.split()[0] for s in report.sets] == [
        _cuda.header_wheel(name, major).dist for name in ("runtime", "crt", "cccl")
    ]
    suffix = "-cu12" if major == 12 else ""
    assert all(s.package.split()[0].endswith(suffix) for s in report.sets)


def test_the_driver_namespace_has_cuda_13_signatures():
    from cuda.bindings import driver as real

    ns = _cuda.driver
    if _cuda.cuda_major() == 13:
        assert ns is real
        return
    for name, v2 in _cuda.RENAMED_ON_12.items():
        bound = getattr(ns, name)
        # Calls taking edge data are wrapped (None edge data goes to the 12.x call
        # without it); the rest are the 12.x functions themselves.
        assert bound is getattr(real, v2) or bound.__doc__ == getattr(real, v2).__doc__
    # Everything else is the bindings' own object.
    assert ns.CUresult is real.CUresult and ns.cuGraphLaunch is real.cuGraphLaunch


def _signature(fn_doc: str) -> tuple[str, list[str]]:
    """The parameter list and the returned names of a cuda.bindings function, from
    its docstring (the first line, and the ``name : type`` lines under Returns)."""
    first = fn_doc.strip().splitlines()[0]
    section = re.search(r"\nReturns\n-+\n(.*?)(?:\n\n|$)", fn_doc, re.S)
    names = re.findall(r"^(\w+)(?: : |$)", section.group(1), re.M) if section else []
    return first[first.index("(") :], names


def _driver_calls() -> set[str]:
    """Every ``driver.cuXxx`` name cuforge's sources use."""
    names: set[str] = set()
    for path in SRC_DIR.rglob("*.py"):
        names.update(re.findall(r"\bdriver\.(cu[A-Z]\w*)\b", path.read_text(encoding="utf-8")))
    return names


@needs_other
def test_every_driver_call_cuforge_makes_has_one_signature_on_12_and_13():
    """Through ``cuforge._cuda.driver``, each function cuforge calls takes the same
    parameters and returns the same values on both majors (RENAMED_ON_12 is complete
    and right)."""
    names = sorted(_driver_calls())
    assert "cuGraphAddNode" in names and "cuLaunchKernelEx" in names
    code = f"""
        import json
        from cuforge._cuda import driver
        print(json.dumps({{n: getattr(driver, n).__doc__ for n in {names!r}}}))
        """
    docs = {}
    for python in (sys.executable, OTHER):
        major = _run(python, "import json; from cuforge import _cuda; print(_cuda.cuda_major())")
        docs[major] = _run(python, code)
    assert set(docs) == {12, 13}
    differ = [n for n in names if _signature(docs[12][n]) != _signature(docs[13][n])]
    assert not differ, {n: (_signature(docs[12][n]), _signature(docs[13][n])) for n in differ}


_NO_EDGE_DATA_CALLS = """
    import json
    from cuforge._cuda import driver
    node = driver.CUgraphNode(0)
    calls = {
        "cuGraphAddNode": lambda: driver.cuGraphAddNode(
            driver.CUgraph(0), [node], None, 1, driver.CUgraphNodeParams()),
        "cuGraphAddDependencies": lambda: driver.cuGraphAddDependencies(
            driver.CUgraph(0), [node], [node], None, 1),
        "cuGraphRemoveDependencies": lambda: driver.cuGraphRemoveDependencies(
            driver.CUgraph(0), [node], [node], None, 1),
        "cuStreamUpdateCaptureDependencies": lambda: driver.cuStreamUpdateCaptureDependencies(
            driver.CUstream(0), [node], None, 1, 0),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = "reached the driver"
        except Exception as exc:
            missing = type(exc).__name__ == "DynamicLibNotFoundError"
            out[name] = "reached the driver" if missing else f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))
"""


def test_calls_without_edge_data_take_dependencies_on_this_major():
    """cuforge passes None edge data with dependencies (CUDA 13's "default edges");
    the bindings must accept that and go on to the driver (an error there is fine:
    null handles, or no driver here) -- cuda-bindings 12's cuGraphAddNode_v2 alone
    would refuse the arguments."""
    got = _run(sys.executable, _NO_EDGE_DATA_CALLS)
    assert set(got.values()) == {"reached the driver"}, got


def test_code_calling_a_renamed_function_gets_the_driver_from_cuforge_cuda():
    """A module that imports ``cuda.bindings.driver`` itself must not call a function
    whose CUDA 12 signature differs (it would break only on CUDA 12)."""
    offenders = []
    for path in SRC_DIR.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if not re.search(
            r"^from cuda\.bindings import driver\b|^import cuda\.bindings\.driver", text, re.M
        ):
            continue
        for name in _cuda.RENAMED_ON_12:
            if re.search(rf"\bdriver\.{name}\b", text):
                offenders.append(f"{path.relative_to(SRC_DIR)}: driver.{name}")
    assert not offenders, offenders


# -- no compiler, or a compiler of the other major --------------------------------------


def _bare_venv(tmp_path: Path) -> str:
    """A venv with no packages of its own that sees this one's through a .pth file:
    cuda.pathfinder looks for wheels in its site-packages only, so it finds no NVRTC
    there."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = _run(
        python, "import json, sysconfig; print(json.dumps(sysconfig.get_paths()['purelib']))"
    )
    # Every package directory this process imports from (not the standard library).
    seen = [p for p in sys.path if p and os.path.isdir(p) and not p.startswith(sys.base_prefix)]
    paths = dict.fromkeys([str(SRC_DIR.parent), sysconfig.get_paths()["purelib"], *seen])
    Path(site, "cuforge-test.pth").write_text("\n".join(paths) + "\n", encoding="utf-8")
    return python


_COMPILE_AND_REPORT = """
    import json, sys, tempfile
    from cuforge import Program, ProgramOptions
    from cuforge.compile.errors import ToolkitNotFoundError
    from cuforge.storage import FileStreamProgramCache
    program = Program({kernel!r}, "c++", ProgramOptions(arch="sm_90"))
    loaded = sorted(m for m in sys.modules if m.startswith("cuda.bindings."))
    errors = []
    with FileStreamProgramCache(tempfile.mkdtemp()) as cache:
        for kw in ({{}}, {{"cache": cache}}):
            try:
                program.compile("cubin", **kw)
                errors.append(None)
            except ToolkitNotFoundError as exc:
                errors.append(str(exc))
        stored = cache.stats().stores
    print(json.dumps({{"loaded": loaded, "errors": errors, "stored": stored}}))
"""


def _env_without_toolkits() -> dict[str, str]:
    hidden = ("CUDA_HOME", "CUDA_PATH", "CONDA_PREFIX")
    return {k: v for k, v in os.environ.items() if k not in hidden}


def test_no_compiler_is_a_clear_error_at_the_first_compile_not_at_import(tmp_path):
    python = _bare_venv(tmp_path)
    env = _env_without_toolkits()
    probe = _run(
        python,
        """
        import json
        from cuda.pathfinder import load_nvidia_dynamic_lib
        try:
            print(json.dumps(load_nvidia_dynamic_lib("nvrtc").abs_path))
        except Exception:
            print(json.dumps(None))
        """,
        env,
    )
    if probe is not None:
        pytest.skip(f"a system CUDA toolkit is installed here ({probe})")
    got = _run(python, _COMPILE_AND_REPORT.format(kernel=KERNEL), env)
    assert got["loaded"] == []  # import and Program() load no compiler
    assert got["stored"] == 0
    for message in got["errors"]:
        assert message and "found no NVRTC library" in message
        assert "pip install 'cuforge[cu" in message and "cuforge[cu12]" in message
        assert "cuforge[cu13]" in message


@needs_other
def test_a_compiler_of_the_other_major_is_refused_naming_the_extra(tmp_path):
    other_lib = _run(
        OTHER,
        """
        import json
        from cuda.pathfinder import load_nvidia_dynamic_lib
        print(json.dumps(load_nvidia_dynamic_lib("nvrtc").abs_path))
        """,
    )
    # A toolkit root (CUDA_HOME) whose lib64 holds only the other major's NVRTC.
    lib64 = tmp_path / "toolkit" / "lib64"
    lib64.mkdir(parents=True)
    for entry in os.listdir(os.path.dirname(other_lib)):
        if entry.startswith("libnvrtc"):
            (lib64 / entry).symlink_to(os.path.join(os.path.dirname(other_lib), entry))
    env = {**_env_without_toolkits(), "CUDA_HOME": str(tmp_path / "toolkit")}
    got = _run(_bare_venv(tmp_path), _COMPILE_AND_REPORT.format(kernel=KERNEL), env)
    major = _cuda.cuda_major()
    other_major = 12 if major == 13 else 13
    assert got["stored"] == 0
    for message in got["errors"]:
        assert message and re.search(
            rf"NVRTC at .*libnvrtc\.so\.{other_major} is CUDA {other_major} but cuda-bindings "
            rf"is {major}\.\d+\.\d+: the two must be of one major",
            message,
        )
        assert f"pip install 'cuforge[cu{major}]'" in message


# -- cache entries of the two majors never mix --------------------------------------------

_FILL = """
    import json
    from cuforge import Program, ProgramOptions, _cuda
    from cuforge.compile.cache._key import _BACKENDS
    from cuforge.storage import FileStreamProgramCache
    from cuforge.utils import make_program_cache_key
    options = ProgramOptions(arch="sm_90")
    with FileStreamProgramCache({cache!r}) as cache:
        obj = Program({kernel!r}, "c++", options).compile("cubin", cache=cache)
        stats = cache.stats()
    key = make_program_cache_key(code={kernel!r}, code_type="c++", options=options,
                                 target_type="cubin")
    print(json.dumps({{"major": _cuda.cuda_major(), "key": key.hex(), "hits": stats.hits,
                      "stores": stats.stores, "compiler": _BACKENDS["c++"].describe(),
                      "size": len(obj.code)}}))
"""


@needs_other
def test_keys_and_entries_of_the_two_majors_never_mix(tmp_path):
    cache = str(tmp_path / "shared-cache")
    fill = _FILL.format(cache=cache, kernel=KERNEL)
    other = _run(OTHER, fill)  # the other major fills the cache first
    here = _run(sys.executable, fill)
    again = _run(OTHER, fill)
    assert {other["major"], here["major"]} == {12, 13}
    assert other["key"] != here["key"]
    # Each major compiled and stored its own entry; neither was served the other's.
    assert (other["hits"], other["stores"]) == (0, 1)
    assert (here["hits"], here["stores"]) == (0, 1)
    assert (again["hits"], again["stores"]) == (1, 0) and again["key"] == other["key"]
    # The key's compiler identity names each NVRTC build and its header wheels.
    assert here["compiler"].startswith(f"nvrtc:{here['major']}.")
    assert other["compiler"].startswith(f"nvrtc:{other['major']}.")
