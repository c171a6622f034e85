"""``cuforge warm`` and ``cuforge doctor`` end to end, through the console script."""

from __future__ import annotations

import json
import shutil

import pytest

from _cli import EXAMPLES, isolated_env, one_line_error, run

MANIFEST = EXAMPLES / "warm.toml"


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """The example manifest (9 kernels, 18 compiles) warmed into a cache, 2 threads."""
    home = tmp_path_factory.mktemp("warm")
    result = run(home, "warm", str(MANIFEST), "--cache", str(home / "c"), "--jobs", "2")
    return home, result


def test_warm_compiles_every_kernel_arch_and_variant(warmed):
    home, result = warmed
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    per_compile = [ln for ln in lines if ln.startswith("compiled ")]
    assert len(per_compile) == 18  # plain lines off a terminal, one per compile
    sources = {ln.split()[1] for ln in per_compile}
    assert len(sources) == 9  # the manifest's nine kernels
    assert "kernels/stencil.cu sm_90 WEIGHT=0.5f" in result.stdout
    assert lines[-1].startswith("18 compiles: 18 compiled, 0 already cached, 0 failed in ")
    assert lines[-1].endswith("(2 jobs)")
    listed = json.loads(run(home, "cache", "ls", "--cache", str(home / "c"), "--json").stdout)
    assert len(listed) == 18 and {e["kind"] for e in listed} == {"program"}


def test_warm_again_is_all_cached_and_proves_it_with_fail_on_miss(warmed):
    home, _ = warmed
    again = run(home, "warm", str(MANIFEST), "--cache", str(home / "c"), "--jobs", "2",
                "--fail-on-miss", "--json")  # fmt: skip
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert (report["compiled"], report["cached"], report["failed"]) == (0, 18, 0)


def test_warmed_entries_are_what_compile_from_the_manifest_directory_hits(warmed):
    home, _ = warmed
    for args in (
        ("kernels/relu.cu", "--std", "c++17"),
        ("kernels/block_sum.cu", "-D", "BLOCK=256"),
    ):
        result = run(home, "compile", *args, "--arch", "sm_90", "--cache", str(home / "c"),
                     "-o", str(home / "x.cubin"), cwd=EXAMPLES)  # fmt: skip
        assert result.returncode == 0 and "cache hit" in result.stdout, result.stderr


def test_fail_on_miss_fails_a_cold_cache_and_workers_count_in_stats(tmp_path):
    small = tmp_path / "m.toml"
    shutil.copy(EXAMPLES / "saxpy.cu", tmp_path / "saxpy.cu")
    for i in range(3):
        (tmp_path / f"k{i}.cu").write_text(
            f'extern "C" __global__ void k(int* p) {{ *p = {i}; }}\n'
        )
    small.write_text(
        '[defaults]\narch = "sm_90"\n[[kernel]]\nsources = ["saxpy.cu", "k0.cu", "k1.cu"]\n'
        '[[kernel]]\nsource = "k2.cu"\n'
    )
    cold = run(tmp_path, "warm", str(small), "--cache", str(tmp_path / "c"), "--fail-on-miss",
               "--jobs", "2")  # fmt: skip
    assert cold.returncode == 1
    assert "4 compiles were not cached (--fail-on-miss)" in cold.stderr
    assert "4 compiles: 4 compiled" in cold.stdout and "(2 jobs)" in cold.stdout
    # the worker processes persisted their counters when they exited
    stats = json.loads(run(tmp_path, "cache", "stats", "--cache", str(tmp_path / "c"),
                           "--json").stdout)  # fmt: skip
    assert (stats["misses"], stats["stores"], stats["entries"]) == (4, 4, 4)
    for extra in ((), ("--threads", "--jobs", "2")):
        warm = run(tmp_path, "warm", str(small), "--cache", str(tmp_path / "c"), "--fail-on-miss",
                   *extra)  # fmt: skip
        assert warm.returncode == 0 and "4 already cached" in warm.stdout, warm.stderr
    one = run(tmp_path, "warm", str(small), "--cache", str(tmp_path / "c"), "--jobs", "1")
    assert one.stdout.rstrip().endswith("(1 job)"), one.stdout  # it said "(1 jobs)"


def test_a_failing_kernel_shows_the_first_lines_of_its_log(tmp_path):
    (tmp_path / "bad.cu").write_text("__global__ void k() { undefined_thing(); }\n")
    (tmp_path / "ok.cu").write_text('extern "C" __global__ void ok(int* p) { *p = 1; }\n')
    manifest = tmp_path / "m.toml"
    manifest.write_text('[defaults]\narch = "sm_90"\n[[kernel]]\nsources = ["bad.cu", "ok.cu"]\n')
    result = run(tmp_path, "warm", str(manifest), "--cache", str(tmp_path / "c"))
    assert result.returncode == 1
    assert "failed: bad.cu sm_90" in result.stdout
    assert 'identifier "undefined_thing" is undefined' in result.stdout
    assert "1 compiled, 0 already cached, 1 failed" in result.stdout


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[kernel]]\nsource = 'nope.cu'\narch = 'sm_90'\n", "source nope.cu not found"),
        ("[[kernel]]\nsource = 'k.cu'\n", "no arch"),
        ("[[kernel]]\nsource = 'k.cu'\narch = 'sm_90'\ncolour = 1\n", "unknown key 'colour'"),
        ("[[kernel]]\nsource = 'k.cu'\narch = 'sm_90'\ntarget = 'fatbin'\n", "target must be"),
        ("[[kernel]]\nsource = 'k.cu'\narch = 7\n", "arch must be a string"),
        ("[defaults]\narch = 'sm_90'\n", "no [[kernel]] tables"),
        ("[[kernel]\n", "not valid TOML"),
    ],
)
def test_bad_manifests_exit_2_with_one_line(tmp_path, text, message):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k() {}\n')
    (tmp_path / "m.toml").write_text(text)
    result = run(tmp_path, "warm", str(tmp_path / "m.toml"), "--cache", str(tmp_path / "c"))
    assert message in one_line_error(result, "cuforge warm")


def test_warm_usage_errors(tmp_path):
    prog = "cuforge warm"
    missing = run(tmp_path, "warm", str(tmp_path / "none.toml"))
    assert "cannot read" in one_line_error(missing, prog)
    jobs = run(tmp_path, "warm", str(MANIFEST), "--jobs", "0")
    assert "positive number of jobs" in one_line_error(jobs, prog)
    bad_cache = run(tmp_path, "warm", str(MANIFEST), "--cache", "memory://?max_size=big")
    assert "not a size" in one_line_error(bad_cache, prog)


def test_doctor_reports_compilers_headers_cache_and_state(tmp_path):
    result = run(tmp_path, "doctor")
    assert result.returncode == 0, result.stderr
    for label in ("cuforge", "cuda-bindings", "NVRTC", "nvJitLink", "libNVVM", "headers cccl",
                  "driver", "cache", "writable", "state dir"):  # fmt: skip
        assert label in result.stdout, label
    report = json.loads(run(tmp_path, "doctor", "--json").stdout)
    nvrtc = report["compilers"][0]
    assert nvrtc["name"] == "NVRTC" and len(nvrtc["build_ids"]) == 2
    assert nvrtc["library"].endswith(".so.13") or "nvrtc" in nvrtc["library"]
    assert report["cache"].endswith("program-cache") and report["writable"] is True
    assert report["exists"] is False  # doctor looks; it creates no cache
    assert not (tmp_path / "xdg" / "cuforge" / "program-cache").exists()
    assert report["problems"] == []


def test_doctor_that_finds_a_problem_exits_1_and_lists_it(tmp_path):
    """``CUFORGE_CACHE=foo://x cuforge doctor`` said "cannot be opened" and exited 0."""
    env = isolated_env(tmp_path, CUFORGE_CACHE="foo://x")
    result = run(tmp_path, "doctor", env=env)
    assert result.returncode == 1, (result.stdout, result.stderr)
    problems = [ln for ln in result.stdout.splitlines() if ln.startswith("problem")]
    assert len(problems) == 1 and "foo://x" in problems[0] and "unknown scheme" in problems[0]
    report = json.loads(run(tmp_path, "doctor", "--json", env=env).stdout)
    assert len(report["problems"]) == 1 and "cannot be opened" in report["problems"][0]


def test_warm_into_a_cache_that_stores_nothing_says_so(tmp_path):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(int* p) { *p = 1; }\n')
    manifest = tmp_path / "m.toml"
    manifest.write_text('[defaults]\narch = "sm_90"\n[[kernel]]\nsource = "k.cu"\n')
    result = run(tmp_path, "warm", str(manifest), "--cache", f"file://{tmp_path}/c?ro")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "1 compiled but not stored: read-only"
    stored = run(tmp_path, "warm", str(manifest), "--cache", str(tmp_path / "d"))
    assert "not stored" not in stored.stdout
