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
    out = str(tmp_path / "x.cubin")
    compiled = run(tmp_path, "compile", str(EXAMPLES / "saxpy.cu"), "--arch", "sm_90", "-o", out,
                   env=env)  # fmt: skip
    refused = one_line_error(compiled, "cuforge compile")  # doctor's line is compile's
    assert report["problems"] == [refused.removeprefix("cuforge compile: error: ")], refused


def test_warm_into_a_cache_that_stores_nothing_says_so(tmp_path):
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(int* p) { *p = 1; }\n')
    manifest = tmp_path / "m.toml"
    manifest.write_text('[defaults]\narch = "sm_90"\n[[kernel]]\nsource = "k.cu"\n')
    result = run(tmp_path, "warm", str(manifest), "--cache", f"file://{tmp_path}/c?ro")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "1 compiled but not stored: read-only"
    stored = run(tmp_path, "warm", str(manifest), "--cache", str(tmp_path / "d"))
    assert "not stored" not in stored.stdout


# -- warm --set: a warm set into the local level ------------------------------------------
META = b'{"kind":"raw","v":1}'


def _stored_set(url: str, keys: list[bytes], name: str = "job") -> None:
    from cuforge.integrations import warmsets
    from cuforge.storage.urls import open_cache

    with open_cache(url) as cache:
        for k in keys:
            cache.set_entry(k, b"payload of " + k, META)
        assert warmsets.store(cache, name, keys)


def _local_holds(path, keys: list[bytes]) -> int:
    from cuforge.storage.urls import open_cache

    with open_cache(str(path), read_only=True) as alone:
        return sum(e is not None for e in alone.get_entries(keys))


def test_warm_set_fetches_into_the_local_level_of_a_tier(tmp_path, redis_server):
    keys = [f"k{i}".encode() for i in range(20)]
    _stored_set(redis_server.url, keys)
    local = tmp_path / "local"
    url = f"file://{local},{redis_server.url}"
    done = run(tmp_path, "warm", "--set", "job", "--cache", url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"warm set job: 20 entries listed, 20 now in the local level file://{local}, 0 missing"
    ), done.stdout
    assert _local_holds(local, keys) == 20  # the local level alone serves them now
    again = run(tmp_path, "warm", "--set", "job", "--cache", url, "--json", "--fail-on-miss")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)["warm_set"]
    assert (report["listed"], report["present"], report["missing"]) == (20, 20, 0)


def test_warm_set_with_a_manifest_fetches_then_compiles(tmp_path, redis_server):
    _stored_set(redis_server.url, [b"a", b"b"], "both")
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(int* p) { *p = 1; }\n')
    manifest = tmp_path / "m.toml"
    manifest.write_text('[defaults]\narch = "sm_90"\n[[kernel]]\nsource = "k.cu"\n')
    local = tmp_path / "local"
    url = f"file://{local},{redis_server.url}"
    done = run(tmp_path, "warm", str(manifest), "--set", "both", "--cache", url, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["compiled"], report["warm_set"]["present"]) == (1, 2)
    assert _local_holds(local, [b"a", b"b"]) == 2


def test_warm_set_on_a_local_cache_checks_it_and_fail_on_miss_counts(tmp_path):
    """A cache that is one local level has nothing to fetch from: the set is checked
    against it (what is there, verified), and --fail-on-miss fails a set with gaps."""
    cache = tmp_path / "c"
    _stored_set(str(cache), [b"a", b"b", b"c"])
    from cuforge.integrations import warmsets
    from cuforge.storage.urls import open_cache

    with open_cache(str(cache)) as opened:  # the set lists one entry the cache lacks
        warmsets.store(opened, "job", [b"a", b"b", b"c", b"gone"])
    done = run(tmp_path, "warm", "--set", "job", "--cache", str(cache))
    assert done.returncode == 0, done.stderr
    assert "4 entries listed, 3 in the cache (one local level: nothing to fetch from), " \
        "1 missing" in done.stdout  # fmt: skip
    strict = run(tmp_path, "warm", "--set", "job", "--cache", str(cache), "--fail-on-miss")
    assert strict.returncode == 1
    assert "1 entries of warm set 'job' are in no level (--fail-on-miss)" in strict.stderr


def test_warm_set_usage_errors_and_an_absent_set(tmp_path, redis_server):
    prog = "cuforge warm"
    neither = run(tmp_path, "warm", "--cache", str(tmp_path / "c"))
    assert "a manifest or --set NAME is required" in one_line_error(neither, prog)
    bad = run(tmp_path, "warm", "--set", "a\nb", "--cache", str(tmp_path / "c"))
    assert "--set: warm set name" in one_line_error(bad, prog)
    empty = run(tmp_path, "warm", "--set", " ", "--cache", str(tmp_path / "c"))
    assert "--set: warm set name" in one_line_error(empty, prog)
    _stored_set(redis_server.url, [b"a"])
    remote = run(tmp_path, "warm", "--set", "job", "--cache", redis_server.url)
    line = one_line_error(remote, prog)
    assert "--set: --cache redis://" in line and "has no local level" in line, line
    env = isolated_env(tmp_path, CUFORGE_CACHE=f"memory://,{redis_server.url}")
    memory_only = run(tmp_path, "warm", "--set", "job", env=env)
    assert "$CUFORGE_CACHE" in one_line_error(memory_only, prog)
    absent = run(tmp_path, "warm", "--set", "nope", "--cache", f"file://{tmp_path / 'l'},"
                 f"{redis_server.url}")  # fmt: skip
    assert absent.returncode == 1 and "Traceback" not in absent.stderr
    assert "no warm set 'nope' is stored in" in absent.stderr
    assert not (tmp_path / "c").exists()  # refused before a cache was made


def test_a_kernels_only_variant_is_named_like_any_other(tmp_path):
    # A kernel with one listed variant was printed bare ("compiled saxpy.cu sm_90") and
    # its JSON said "variant": "", so nothing showed that A=1 was applied.
    shutil.copy(EXAMPLES / "saxpy.cu", tmp_path / "saxpy.cu")
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        '[[kernel]]\nsource = "saxpy.cu"\narch = "sm_90"\nvariants = [{defines = ["A=1"]}]\n'
        '[[kernel]]\nsource = "saxpy.cu"\narch = "sm_80"\nvariants = [{}]\n'
        '[[kernel]]\nsource = "saxpy.cu"\narch = "sm_75"\n'
    )
    cache = str(tmp_path / "c")
    text = run(tmp_path, "warm", str(manifest), "--cache", cache, "--jobs", "1")
    assert text.returncode == 0, text.stderr
    compiled = sorted(ln for ln in text.stdout.splitlines() if ln.startswith("compiled "))
    assert [ln.split(" (")[0] for ln in compiled] == [
        "compiled saxpy.cu sm_75",  # no variants listed: nothing to name
        "compiled saxpy.cu sm_80 variant 1",  # a listed variant without settings
        "compiled saxpy.cu sm_90 A=1",
    ], compiled
    again = run(tmp_path, "warm", str(manifest), "--cache", cache, "--jobs", "1", "--json")
    report = json.loads(again.stdout)
    assert sorted(r["variant"] for r in report["results"]) == ["", "A=1", "variant 1"], report
