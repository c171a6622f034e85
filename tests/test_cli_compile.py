"""``cuforge compile`` end to end: the installed console script in a subprocess,
real NVRTC compiles of small kernels, real file caches."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from _cli import SAXPY, isolated_env, one_line_error, run

ELF = b"\x7fELF"


def _twice_src(path, value=2):
    path.write_text(
        f'extern "C" __global__ void twice(float* a) {{ a[threadIdx.x] *= {value}; }}\n'
    )
    return path


def test_compile_without_cache_reports_output_and_time(tmp_path):
    out = tmp_path / "saxpy.cubin"
    result = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(out), "--no-cache")
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:4] == ELF
    line = result.stdout.strip()
    assert line.startswith(f"{SAXPY} -> {out} (cubin, sm_90, ") and line.endswith(" ms")
    assert ", cache" not in line


def test_second_process_hits_and_counts_in_stats(tmp_path):
    cache = tmp_path / "c"
    args = ("compile", str(SAXPY), "--arch", "sm_90", "--cache", str(cache))
    first = run(tmp_path, *args, "-o", str(tmp_path / "a.cubin"))
    second = run(tmp_path, *args, "-o", str(tmp_path / "b.cubin"))
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.rstrip().endswith(f"cache miss (compiled and stored in {cache})")
    assert second.stdout.rstrip().endswith("cache hit")
    assert (tmp_path / "a.cubin").read_bytes() == (tmp_path / "b.cubin").read_bytes()
    stats = json.loads(run(tmp_path, "cache", "stats", "--cache", str(cache), "--json").stdout)
    assert (stats["hits"], stats["misses"], stats["stores"], stats["entries"]) == (1, 1, 1, 1)


def test_a_cli_hit_imports_no_archive_or_tree_copying_modules(tmp_path):
    # shutil (with fnmatch, re, bz2, lzma) cost ~5 ms of a ~20 ms hit process; only
    # a repair of a non-regular object in the cache folder needs it (rmtree).
    args = ("compile", str(SAXPY), "--arch", "sm_90", "--cache", str(tmp_path / "c"), "-o")
    for _ in range(2):  # fill, then a hit that records what a repeated command trusts
        assert run(tmp_path, *args, str(tmp_path / "a.cubin")).returncode == 0
        time.sleep(2.1)  # the state records are trusted by stat once 2 s old
    env = isolated_env(tmp_path, PYTHONPROFILEIMPORTTIME="1")
    done = run(tmp_path, *args, str(tmp_path / "a.cubin"), env=env)  # the repeated command
    assert done.returncode == 0 and done.stdout.rstrip().endswith("cache hit"), done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "cuforge.storage.filestream" in imported, done.stderr  # the report is there
    assert not {"shutil", "fnmatch", "bz2", "lzma"} & imported


def test_caching_is_on_by_default_env_chooses_where(tmp_path):
    src = _twice_src(tmp_path / "k.cu")
    # no --cache: the user cache directory (XDG_CACHE_HOME here)
    result = run(tmp_path, "compile", str(src), "--arch", "sm_90")
    assert result.returncode == 0 and "cache miss" in result.stdout, result.stderr
    assert any((tmp_path / "xdg" / "cuforge" / "program-cache" / "entries").iterdir())
    # $CUFORGE_CACHE_DIR (the older spelling) and $CUFORGE_CACHE (a URL) choose the cache
    for name, value in (("CUFORGE_CACHE_DIR", "d1"), ("CUFORGE_CACHE", "file://{}/d2")):
        where = value.format(tmp_path) if "{}" in value else str(tmp_path / value)
        env = isolated_env(tmp_path, **{name: where})
        result = run(tmp_path, "compile", str(src), "--arch", "sm_90", env=env)
        assert "cache miss" in result.stdout, result.stderr
        assert (tmp_path / value.rsplit("/", 1)[-1] / "entries").is_dir()
    off = run(tmp_path, "compile", str(src), "--arch", "sm_90",
              env=isolated_env(tmp_path, CUFORGE_CACHE="off"))  # fmt: skip
    assert off.returncode == 0 and ", cache" not in off.stdout


def test_several_files_and_archs_in_parallel_with_outdir_and_json(tmp_path):
    a = _twice_src(tmp_path / "a.cu", 2)
    b = _twice_src(tmp_path / "b.cu", 3)
    out, cache = str(tmp_path / "out"), str(tmp_path / "c")
    args = ["compile", str(a), str(b), "--arch", "sm_80", "--arch", "sm_90",
            "--outdir", out, "--cache", cache, "--json"]  # fmt: skip
    first = run(tmp_path, *args)
    assert first.returncode == 0, first.stderr
    results = json.loads(first.stdout)
    assert [(r["source"], r["arch"], r["cache"]) for r in results] == [
        (str(a), "sm_80", "miss"), (str(a), "sm_90", "miss"),
        (str(b), "sm_80", "miss"), (str(b), "sm_90", "miss"),
    ]  # fmt: skip
    for stem in ("a", "b"):
        for arch in ("sm_80", "sm_90"):
            assert (tmp_path / "out" / f"{stem}.{arch}.cubin").read_bytes()[:4] == ELF
    again = json.loads(run(tmp_path, *args).stdout)
    assert [r["cache"] for r in again] == ["hit"] * 4
    assert {r["bytes"] for r in again} == {r["bytes"] for r in results}


def test_o_names_one_output_only(tmp_path):
    result = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_80", "--arch", "sm_90", "-o", "x")
    assert "--outdir" in one_line_error(result, "cuforge compile")


def test_defines_includes_std_pre_include_and_ptx_target(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "scale.cuh").write_text("#define SCALE 3\n")
    (tmp_path / "pre.h").write_text("#define PRE 7\n")
    src = tmp_path / "k.cu"
    src.write_text(
        '#include "scale.cuh"\nextern "C" __global__ void k(int* p) { *p = SCALE * EXTRA + PRE; }\n'
    )
    result = run(
        tmp_path, "compile", str(src), "--arch", "sm_90", "--target", "PTX", "-D", "EXTRA=5",
        "-I", str(tmp_path / "inc"), "--std", "c++17", "-include", str(tmp_path / "pre.h"),
        "--cache", str(tmp_path / "c"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    ptx = (tmp_path / "k.ptx").read_text()  # default output: beside the source
    assert ".entry k" in ptx and "22" in ptx  # 3 * 5 + 7


def test_ltoir_target_and_ptx_input(tmp_path):
    ptx = tmp_path / "saxpy.ptx"
    made = run(
        tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--target", "ptx", "-o", str(ptx)
    )
    assert made.returncode == 0, made.stderr
    result = run(tmp_path, "compile", str(ptx), "--arch", "sm_90")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "saxpy.cubin").read_bytes()[:4] == ELF
    lto = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--target", "ltoir",
              "-o", str(tmp_path / "s.lto"))  # fmt: skip
    assert lto.returncode == 0 and (tmp_path / "s.lto").stat().st_size > 0


def test_compile_error_prints_log_exit_1_and_still_writes_the_good_output(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k() { missing(); }\n")
    good = _twice_src(tmp_path / "good.cu")
    result = run(tmp_path, "compile", str(bad), str(good), "--arch", "sm_90",
                 "--cache", str(tmp_path / "c"))  # fmt: skip
    assert result.returncode == 1
    assert 'identifier "missing" is undefined' in result.stderr
    assert not (tmp_path / "bad.cubin").exists()
    assert (tmp_path / "good.cubin").read_bytes()[:4] == ELF
    assert "compile failed" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # named as typed, not as the Python API's fields (issue 36, item 6)
        (["--arch", "sm90"], "error: --arch must look like 'sm_90'"),
        (["--arch", "sm_90", "--std", "c++99"], "error: --std must be one of"),
        (["--arch", "sm_90", "-D", "1BAD"], "error: -D 1BAD has an invalid macro name"),
        (["--arch", "sm_90", "--target", "fatbin"], "invalid choice"),
        (["--arch", "sm_90", "--max-size", "12Q"], "not a size"),
        (["--arch", "sm_90", "--cache", "nope://x"], "unknown scheme"),
        (["--arch", "sm_90", "--cache", "c", "--no-cache"], "contradict"),
        (["--arch", "sm_90", "--no"], "unrecognized arguments"),
    ],
)
def test_bad_option_values_exit_2_with_one_line(tmp_path, args, message):
    result = run(tmp_path, "compile", str(SAXPY), *args, "-o", str(tmp_path / "o"))
    assert message in one_line_error(result, "cuforge compile")


def test_usage_errors_exit_2(tmp_path):
    missing = run(tmp_path, "compile", str(tmp_path / "missing.cu"), "--arch", "sm_90")
    assert "cannot read" in one_line_error(missing, "cuforge compile")
    one_line_error(run(tmp_path, "compile"), "cuforge compile")
    bogus = run(tmp_path, "bogus")
    assert "invalid choice" in one_line_error(bogus, "cuforge")
    (tmp_path / "file").write_text("x")
    as_dir = run(
        tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--cache", str(tmp_path / "file")
    )
    assert "not a directory" in one_line_error(as_dir, "cuforge compile")
    proc = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--cache", "/proc/nope")
    assert "/proc/nope" in one_line_error(proc, "cuforge compile")


def test_a_file_taken_as_the_value_of_cache_is_named(tmp_path):
    """``--cache`` takes an optional value, so ``--cache kernel.cu`` swallows the FILE;
    the error says so instead of only "required: FILE"."""
    result = run(tmp_path, "compile", "--arch", "sm_90", "--cache", str(SAXPY))
    line = one_line_error(result, "cuforge compile")
    assert "required: FILE" in line and f"{str(SAXPY)!r} was taken as the value of --cache" in line
    plain = one_line_error(run(tmp_path, "compile", "--arch", "sm_90"), "cuforge compile")
    assert "--cache" not in plain.split("(see")[0]


def test_compiler_warnings_are_printed_on_every_hit(tmp_path):
    """A hit printed nothing where the miss printed the compiler's warning."""
    src = tmp_path / "warns.cu"
    src.write_text('#warning "hello from the kernel"\n'
                   'extern "C" __global__ void w(int* a) { a[0] = 1; }\n')  # fmt: skip
    args = ("compile", str(src), "--arch", "sm_90", "-o", str(tmp_path / "w.cubin"),
            "--cache", str(tmp_path / "cache"))  # fmt: skip
    for attempt in range(3):  # a miss, then hits (the fast path must not hide it either)
        result = run(tmp_path, *args)
        assert result.returncode == 0, result.stderr
        assert "hello from the kernel" in result.stderr, (attempt, result.stderr)
        assert ("miss" if attempt == 0 else "hit") in result.stdout


def test_missing_arch_without_device_asks_for_arch(tmp_path):
    from cuforge.compile._versions import current_device_arch

    if current_device_arch() is not None:
        pytest.skip("a CUDA device is present, so --arch defaults to it")
    result = run(tmp_path, "compile", str(SAXPY), "--no-cache")
    assert "--arch" in one_line_error(result, "cuforge compile")


def test_main_is_importable_and_returns_int(tmp_path, capsys, monkeypatch):
    from cuforge.cli import main

    monkeypatch.setenv("CUFORGE_STATE_DIR", str(tmp_path / "state"))
    args = ["compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "o.cubin")]
    assert main([*args, "--cache", str(tmp_path / "c")]) == 0
    assert "o.cubin" in capsys.readouterr().out


# -- the fast hit path (cuforge.cli._direct) ---------------------------------------------
def _imports(result) -> set[str]:
    """Modules a run imported (PYTHONPROFILEIMPORTTIME lines on stderr)."""
    return {
        line.rsplit("|", 1)[-1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }


def _hit_setup(tmp_path):
    src = _twice_src(tmp_path / "k.cu")
    env = isolated_env(tmp_path)
    args = ("compile", "k.cu", "--arch", "sm_90", "-o", "k.cubin", "--cache", str(tmp_path / "c"))
    traced = {**env, "PYTHONPROFILEIMPORTTIME": "1"}
    return src, env, args, traced


def test_repeated_command_is_served_without_the_compile_layer(tmp_path):
    _, env, args, traced = _hit_setup(tmp_path)
    first = run(tmp_path, *args, cwd=tmp_path, env=env)
    assert "cache miss" in first.stdout, first.stderr
    if not (tmp_path / "state" / "cli-hits").is_dir():
        pytest.skip("compiler files changed less than 2 s ago: identity not recorded yet")
    fast = run(tmp_path, *args, cwd=tmp_path, env=traced)
    assert fast.returncode == 0
    assert fast.stdout.split(" in ")[0] == first.stdout.split(" in ")[0]  # same report line
    assert fast.stdout.rstrip().endswith("cache hit")
    modules = _imports(fast)
    assert "cuforge.cli._direct" in modules
    assert not {"argparse", "cuforge.compile.program", "cuforge.compile.cache_key"} & modules
    (tmp_path / "k.cubin").unlink()
    assert run(tmp_path, *args, cwd=tmp_path, env=env).returncode == 0
    assert (tmp_path / "k.cubin").read_bytes()[:4] == ELF
    stats = json.loads(run(tmp_path, "cache", "stats", "--cache", str(tmp_path / "c"), "--json",
                           env=env).stdout)  # fmt: skip
    assert (stats["hits"], stats["misses"]) == (2, 1)  # fast hits are counted like any other


@pytest.mark.parametrize("change", ["source", "entry", "identity", "argv"])
def test_fast_path_steps_aside_whenever_anything_changed(tmp_path, change):
    src, env, args, traced = _hit_setup(tmp_path)
    assert run(tmp_path, *args, cwd=tmp_path, env=env).returncode == 0
    if not (tmp_path / "state" / "cli-hits").is_dir():
        pytest.skip("compiler files changed less than 2 s ago: identity not recorded yet")
    before = (tmp_path / "k.cubin").read_bytes()
    if change == "source":
        _twice_src(src, 5)
    elif change == "entry":
        shutil.rmtree(tmp_path / "c" / "entries")
    elif change == "identity":
        for record in (tmp_path / "state" / "identity").iterdir():
            record.write_bytes(record.read_bytes()[:-3])  # a witness no longer matches
    else:
        args = (*args, "-D", "UNUSED=1")
    result = run(tmp_path, *args, cwd=tmp_path, env=traced)
    assert result.returncode == 0, result.stderr
    assert "cuforge.compile.program" in _imports(result)  # the full path answered
    expect = {"source": "cache miss", "entry": "cache miss", "identity": "cache hit",
              "argv": "cache miss"}[change]  # fmt: skip
    assert expect in result.stdout
    after = (tmp_path / "k.cubin").read_bytes()
    assert (after != before) == (change == "source")


def test_sources_that_read_headers_are_never_answered_by_the_fast_path(tmp_path):
    src = tmp_path / "h.cu"
    src.write_text('#include "v.h"\nextern "C" __global__ void k(int* p) { *p = V; }\n')
    env = {**isolated_env(tmp_path), "PYTHONPROFILEIMPORTTIME": "1"}
    args = ("compile", "h.cu", "--arch", "sm_90", "--cache", str(tmp_path / "c"))
    outputs = []
    for value, expect in ((1, "cache miss"), (1, "cache hit"), (2, "cache miss")):
        (tmp_path / "v.h").write_text(f"#define V {value}\n")
        result = run(tmp_path, *args, cwd=tmp_path, env=env)
        assert expect in result.stdout, result.stderr
        assert "cuforge.compile.program" in _imports(result)
        outputs.append((tmp_path / "h.cubin").read_bytes())
    assert outputs[0] == outputs[1] != outputs[2]
    hits = tmp_path / "state" / "cli-hits"
    assert not hits.exists() or not [p for p in hits.rglob("*") if p.is_file()]


@pytest.mark.parametrize("kind", ["redis", "file,redis", "redis-with-password"])
def test_fleet_caches_are_served_by_the_fast_path_without_redis_py(tmp_path, redis_server, kind):
    """A repeated command through Redis, or a tier whose disk level holds the entry, is
    answered by the hit record: no compile layer, no redis-py; the disk of a tier
    answers without the Redis level being opened at all. A URL with a password is
    never written into a record: the full path answers it."""
    src = _twice_src(tmp_path / "k.cu")
    env = isolated_env(tmp_path)
    url = {
        "redis": redis_server.url + "?prefix=fast:",
        "file,redis": f"file://{tmp_path / 'c'},{redis_server.url}",
        "redis-with-password": redis_server.url.replace("redis://", "redis://:pw@"),
    }[kind]
    if kind == "redis-with-password":
        redis_server.client().config_set("requirepass", "pw")
    args = ("compile", "k.cu", "--arch", "sm_90", "-o", "k.cubin", "--cache", url)
    first = run(tmp_path, *args, cwd=tmp_path, env=env)
    assert "cache miss" in first.stdout, first.stderr
    if not (tmp_path / "state" / "identity").is_dir():
        pytest.skip("compiler files changed less than 2 s ago: identity not recorded yet")
    (tmp_path / "k.cubin").unlink()
    fast = run(tmp_path, *args, cwd=tmp_path, env={**env, "PYTHONPROFILEIMPORTTIME": "1"})
    assert fast.returncode == 0 and fast.stdout.rstrip().endswith("cache hit"), fast.stderr
    assert (tmp_path / "k.cubin").read_bytes()[:4] == ELF
    modules = _imports(fast)
    assert "redis" not in modules  # never redis-py on a hit
    if kind == "redis-with-password":
        assert "cuforge.compile.program" in modules  # no record: the full path answered
        records = tmp_path / "state" / "cli-hits"
        assert not records.exists() or not [p for p in records.rglob("*") if p.is_file()]
        return
    assert "cuforge.cli._direct" in modules
    assert not {"argparse", "cuforge.compile.program"} & modules
    opened = "cuforge.storage.redis._resp" in modules
    assert opened == (kind == "redis")  # a tier's disk answers: Redis is never opened
    if kind == "redis":
        stats = json.loads(run(tmp_path, "cache", "stats", "--cache", url, "--json",
                               env=env).stdout)  # fmt: skip
        assert (stats["hits"], stats["misses"]) == (1, 1)  # fast hits count once, fleet-wide
    assert src.read_text()  # the source is untouched


def test_a_tier_with_memory_in_front_of_redis_is_served_by_redis_and_ro_never(
    tmp_path, redis_server
):
    """``memory://,redis://…``: the record names the Redis level; a read-only first
    persistent level is never recorded (the fast path would open it writable)."""
    _twice_src(tmp_path / "k.cu")
    env = isolated_env(tmp_path)
    fill = ("compile", "k.cu", "--arch", "sm_90", "--cache", str(tmp_path / "ro"))
    assert run(tmp_path, *fill, cwd=tmp_path, env=env).returncode == 0  # the ro level has it
    for url, fast in ((f"memory://,{redis_server.url}", True),
                      (f"file://{tmp_path / 'ro'}?ro,{redis_server.url}", False)):  # fmt: skip
        args = ("compile", "k.cu", "--arch", "sm_90", "-o", "k.cubin", "--cache", url)
        assert run(tmp_path, *args, cwd=tmp_path, env=env).returncode == 0
        if not (tmp_path / "state" / "identity").is_dir():
            pytest.skip("compiler files changed less than 2 s ago: identity not recorded yet")
        again = run(tmp_path, *args, cwd=tmp_path, env={**env, "PYTHONPROFILEIMPORTTIME": "1"})
        assert again.returncode == 0 and again.stdout.rstrip().endswith("cache hit")
        modules = _imports(again)
        assert ("cuforge.compile.program" not in modules) == fast, url
        assert "redis" not in modules


@pytest.mark.skipif(not hasattr(os, "kill"), reason="SIGSTOP")
def test_a_hung_redis_never_fails_a_command_that_compiled(tmp_path, redis_server):
    """A server that hangs between the lookup and the hit record's read-back: the
    command compiles, writes its output and exits 0 (the record is simply not left)."""
    _twice_src(tmp_path / "k.cu")
    env = isolated_env(tmp_path)
    url = redis_server.url + "?timeout=200ms"
    args = ("compile", "k.cu", "--arch", "sm_90", "-o", "k.cubin", "--cache", url)
    redis_server.pause()
    try:
        result = run(tmp_path, *args, cwd=tmp_path, env=env)
    finally:
        redis_server.resume()
    assert result.returncode == 0, result.stderr
    assert "cache miss" in result.stdout and "error" not in result.stderr
    assert (tmp_path / "k.cubin").read_bytes()[:4] == ELF


def test_a_virtual_arch_for_a_cubin_is_a_usage_error(tmp_path):
    """``--arch compute_90`` with the default cubin target printed "compile failed" and
    exited 1; nothing was compiled: it is a usage error naming the two ways out."""
    out = tmp_path / "x.cubin"
    result = run(tmp_path, "compile", str(SAXPY), "--arch", "compute_90", "-o", str(out))
    line = one_line_error(result, "cuforge compile")
    assert "compute_90" in line and "--arch sm_90" in line and "--target ptx" in line
    assert not out.exists() and not (tmp_path / "xdg").exists()  # nothing compiled or stored
    ptx = run(tmp_path, "compile", str(SAXPY), "--arch", "compute_90", "--target", "ptx",
              "-o", str(tmp_path / "x.ptx"), "--no-cache")  # fmt: skip
    assert ptx.returncode == 0, ptx.stderr
    assert b".target sm_90" in (tmp_path / "x.ptx").read_bytes()


def test_an_output_that_cannot_be_written_is_refused_before_compiling(tmp_path):
    """``-o nodir/x.cubin`` compiled and stored, then failed to write; now nothing runs."""
    cache = tmp_path / "c"
    result = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--cache", str(cache),
                 "-o", str(tmp_path / "nodir" / "x.cubin"))  # fmt: skip
    line = one_line_error(result, "cuforge compile")
    assert f"the directory {tmp_path / 'nodir'} does not exist" in line
    assert not (cache / "entries").exists() or not any((cache / "entries").rglob("*.*"))
    as_dir = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path))
    assert "is a directory" in one_line_error(as_dir, "cuforge compile")
    (tmp_path / "plain").write_text("x")
    outdir = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90",
                 "--outdir", str(tmp_path / "plain"))  # fmt: skip
    assert "exists and is not a directory" in one_line_error(outdir, "cuforge compile")


def test_a_result_larger_than_the_cap_is_not_stored_and_evicts_nothing(tmp_path):
    """A cubin larger than --max-size evicted every other entry, then itself; it is
    refused now, and the line says why."""
    from cuforge.storage import FileStreamProgramCache

    cache = tmp_path / "c"
    with FileStreamProgramCache(cache, max_size_bytes=1024) as c:
        c[b"small"] = b"s" * 100
    result = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                 str(tmp_path / "x.cubin"), "--cache", str(cache), "--max-size", "1K")  # fmt: skip
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.endswith("cache miss (compiled; not stored: larger than the cache's size cap)")
    with FileStreamProgramCache(cache) as c:
        assert c.get(b"small") == b"s" * 100 and len(c) == 1
        totals = c.total_stats()
        assert (totals.evictions, totals.write_failures) == (0, 1), totals


def test_a_miss_says_whether_it_was_stored_and_why_not(tmp_path):
    """``cache miss (compiled and stored)`` was printed when nothing was stored (Redis
    unreachable, a read-only cache); the line and --json say what happened."""
    from _redis import free_port

    def compile_with(cache, *extra):
        result = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90",
                     "-o", str(tmp_path / "x.cubin"), "--cache", cache, *extra)  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result

    dead = f"redis://127.0.0.1:{free_port()}/0?connect_timeout=200ms"
    for cache, extra, why, code in (
        (dead, (), "unreachable", "unreachable"),
        (f"file://{tmp_path}/ro?ro", (), "read-only", "read-only"),
        (str(tmp_path / "capped"), ("--max-size", "1K"), "larger than the cache's size cap",
         "too-large"),
    ):  # fmt: skip
        line = compile_with(cache, *extra).stdout.strip()
        assert line.endswith(f"cache miss (compiled; not stored: {why})"), line
        (report,) = json.loads(compile_with(cache, *extra, "--json").stdout)
        assert (report["cache"], report["stored"], report["not_stored"]) == ("miss", False, code)
    stored = compile_with(str(tmp_path / "ok")).stdout.strip()
    assert stored.endswith(f"cache miss (compiled and stored in {tmp_path / 'ok'})")
    stats = json.loads(run(tmp_path, "cache", "stats", "--cache", str(tmp_path / "ok"),
                           "--json").stdout)  # fmt: skip
    assert stats["entries"] == 1
    (hit,) = json.loads(compile_with(str(tmp_path / "ok"), "--json").stdout)
    assert hit["cache"] == "hit" and "stored" not in hit


def _need_nvfatbin() -> None:
    """Skip, saying why, where these bindings have no nvFatbin (an older cuda-bindings
    12.x); the cu13 extra installs it."""
    from cuforge import _cuda
    from cuforge.compile.errors import ToolkitNotFoundError

    try:
        _cuda.require("nvfatbin")
    except ToolkitNotFoundError as exc:
        pytest.skip(str(exc))


def _fatbin_parts(data: bytes) -> list[tuple[str, int]]:
    """(kind, arch number) of each part of a fatbin, from its container headers."""
    import struct

    magic, _, header, size = struct.unpack_from("<IHHQ", data, 0)
    assert magic == 0xBA55ED50 and header + size == len(data)
    parts, pos = [], header
    while pos < len(data):
        kind, _, part_header, part_size = struct.unpack_from("<HHIQ", data, pos)
        parts.append(({1: "ptx", 2: "cubin"}[kind], struct.unpack_from("<I", data, pos + 28)[0]))
        pos += part_header + part_size
    return parts


def test_one_fatbin_for_several_archs_is_built_through_the_cache_per_arch(tmp_path):
    from cuforge import ObjectCode

    _need_nvfatbin()

    out, cache = tmp_path / "k.fatbin", str(tmp_path / "c")
    first = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_80,sm_90", "-o", str(out),
                "--cache", cache, "--json")  # fmt: skip
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    # the fatbin is packed, never looked up: "off" said there was no cache
    assert [(r["arch"], r["target"], r["cache"]) for r in report] == [
        ("sm_80", "cubin", "miss"), ("sm_90", "cubin", "miss"), ("sm_80,sm_90", "fatbin", "packed")
    ]  # fmt: skip
    assert report[-1]["parts"] == 2 and "stored" not in report[-1]
    text = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_80,sm_90", "-o", str(out),
               "--cache", cache).stdout.splitlines()  # fmt: skip
    assert [line.rsplit(", ", 1)[-1] for line in text] == [
        "cache hit", "cache hit", "packed from 2 parts"
    ]  # fmt: skip
    assert sorted(_fatbin_parts(out.read_bytes())) == [("cubin", 80), ("cubin", 90)]
    # adding archs compiles only those; a compute_XY arch goes in as PTX
    again = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_80,sm_90", "--arch",
                "sm_100,compute_100", "-o", str(out), "--cache", cache, "--json")  # fmt: skip
    assert again.returncode == 0, again.stderr
    caches = {(r["arch"], r["target"]): r["cache"] for r in json.loads(again.stdout)}
    assert caches == {("sm_80", "cubin"): "hit", ("sm_90", "cubin"): "hit",
                      ("sm_100", "cubin"): "miss", ("compute_100", "ptx"): "miss",
                      ("sm_80,sm_90,sm_100,compute_100", "fatbin"): "packed"}  # fmt: skip
    assert sorted(_fatbin_parts(out.read_bytes())) == [
        ("cubin", 80), ("cubin", 90), ("cubin", 100), ("ptx", 100)
    ]  # fmt: skip
    loaded = ObjectCode.from_fatbin(str(out))
    assert loaded.code_type == "fatbin" and loaded.code == out.read_bytes()
    for args, message in (
        (("--arch", "sm_90"), "one FILE"),  # two files
        ((), "needs the archs"),
        (("--arch", "sm_90", "--target", "ptx"), "leave --target out"),
    ):
        files = (str(SAXPY), str(SAXPY)) if message == "one FILE" else (str(SAXPY),)
        bad = run(tmp_path, "compile", *files, *args, "-o", str(tmp_path / "x.fatbin"))
        assert message in one_line_error(bad, "cuforge compile")


def test_pack_fatbin_refuses_what_a_fatbin_cannot_hold():
    from cuforge import Program, ProgramOptions
    from cuforge.compile import pack_fatbin

    cubin = Program(SAXPY.read_text(), "c++", ProgramOptions(arch="sm_90")).compile("cubin")
    with pytest.raises(ValueError, match="at least one"):
        pack_fatbin([])
    with pytest.raises(ValueError, match="two cubin parts for arch sm_90"):
        pack_fatbin([(cubin, "sm_90"), (cubin, "sm_90")])
    with pytest.raises(ValueError, match="not sm_XY or compute_XY"):
        pack_fatbin([(cubin, "ninety")])
    lto = Program(
        SAXPY.read_text(), "c++", ProgramOptions(arch="sm_90", link_time_optimization=True)
    )
    with pytest.raises(ValueError, match="cubin and PTX ObjectCode, got ltoir"):
        pack_fatbin([(lto.compile("ltoir"), "sm_90")])
    _need_nvfatbin()
    assert pack_fatbin([(cubin, "sm_90")], "saxpy").code_type == "fatbin"
