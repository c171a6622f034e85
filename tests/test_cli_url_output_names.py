"""Messages a newcomer pass found untrue, through the installed ``cuforge`` script in a
subprocess, real NVRTC compiles on real caches; each test fails on the main it was
written against.

1. ``cache dir --cache 's3://bucket?endpoint=notaurl'`` printed the URL and exited 0,
   while ``cache stats`` refused it: the endpoint (and a Redis prefix with braces, an
   ``ssl_cert_reqs`` that is not none/optional/required) was checked only at open.
2. ``redis://localhost:99999/0`` said ``port '99999' is not a number``;
   ``redis://localhost:0/0`` was accepted.
3. ``-o /proc/x.cubin`` was refused only after NVRTC compiled and the cache stored.
4. A source named ``nl<newline>x.cu`` took two lines in ``cache ls`` and in the
   compile report.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _cli import SAXPY, SCRIPT, isolated_env, one_line_error, read_only_run, run

# (URL, what the line says about it): every one refused alike by every command
BAD_URLS = [
    (
        "s3://bucket?endpoint=notaurl",
        "endpoint must start with http:// or https://, got 'notaurl'",
    ),
    (
        "s3://bucket?endpoint=http://h:99999",
        "endpoint 'http://h:99999' is not a URL with a host and a valid port "
        "(port 99999 is out of range 1-65535)",
    ),
    ("redis://localhost:99999/0", "port 99999 is out of range 1-65535"),
    ("redis://localhost:0/0", "port 0 is out of range 1-65535"),
    ("redis://h/0?prefix=a{b}", "prefix='a{b}': braces are not allowed (keys are <prefix>{<id>})"),
    ("rediss://h/0?ssl_cert_reqs=bogus", "ssl_cert_reqs='bogus': use none, optional or required"),
]
URL_IDS = ["s3 endpoint", "s3 endpoint port", "redis port", "redis port 0", "prefix", "tls"]


@pytest.mark.parametrize(("url", "says"), BAD_URLS, ids=URL_IDS)
def test_cache_dir_refuses_what_every_cache_command_refuses(
    tmp_path: Path, url: str, says: str
) -> None:
    # cache dir printed the URL, exit 0 (the redis port: "'99999' is not a number")
    for command in ("dir", "stats", "ls"):
        done = run(tmp_path, "cache", command, "--cache", url)
        line = one_line_error(done, f"cuforge cache {command}")
        assert line.endswith(f"--cache: cache URL {url!r}: {says}"), line
    env = isolated_env(tmp_path, CUFORGE_CACHE=url)
    line = one_line_error(run(tmp_path, "cache", "dir", env=env), "cuforge cache dir")
    assert line.endswith(f"$CUFORGE_CACHE: cache URL {url!r}: {says}"), line


@pytest.mark.parametrize(("url", "says"), BAD_URLS, ids=URL_IDS)
def test_compile_refuses_it_behind_a_file_level_before_compiling(
    tmp_path: Path, url: str, says: str
) -> None:
    # A lazy level behind the file level was opened only when reached: the compile ran,
    # and a bad endpoint or prefix was a warning (a port 0 went to port 6379).
    disk = tmp_path / "c"
    done = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
               str(tmp_path / "k.cubin"), "--cache", f"file://{disk},{url}")  # fmt: skip
    line = one_line_error(done, "cuforge compile")
    assert line.endswith(f"--cache: cache URL {url!r}: {says}"), line
    assert not disk.exists() and not (tmp_path / "k.cubin").exists()


def test_checking_the_moved_parts_loads_no_client(tmp_path: Path) -> None:
    # The endpoint, prefix and TLS checks run in the backends' _url modules: refusing
    # them at open must not import the S3 or Redis handle, driver or client.
    code = f"""
import sys
from cuforge.storage import open_cache
for level in ("s3://b?endpoint=notaurl", "redis://h:0/0", "redis://h?prefix=%7Bx",
              "rediss://h?ssl_cert_reqs=maybe"):
    try:
        open_cache("file://{tmp_path / "c"}," + level, secret=None).close()
    except ValueError as exc:
        print("refused:", exc)
heavy = ("cuforge.storage.redis._cache", "cuforge.storage.s3._cache", "cuforge.storage.remote",
         "cuforge.storage.redis._store", "cuforge.storage.s3._store", "redis", "obstore")
print("loaded:", sorted(m for m in heavy if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=isolated_env(tmp_path), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "refused: cache URL 's3://b?endpoint=notaurl': endpoint must start with http:// or "
        "https://, got 'notaurl'",
        "refused: cache URL 'redis://h:0/0': port 0 is out of range 1-65535",
        "refused: cache URL 'redis://h?prefix=%7Bx': prefix='{x': braces are not allowed "
        "(keys are <prefix>{<id>})",
        "refused: cache URL 'rediss://h?ssl_cert_reqs=maybe': ssl_cert_reqs='maybe': use "
        "none, optional or required",
        "loaded: []",
    ], done.stdout
    assert not (tmp_path / "c").exists()


def test_good_ports_endpoints_and_tls_words_still_pass(tmp_path: Path) -> None:
    for url in ("redis://h:65535/0", "redis://h:1/0", "redis://[::1]:6379/0", "redis://h/0",
                "s3://b?endpoint=http://[::1]:9000", "s3://b?endpoint=https://h",
                "rediss://h/0?ssl_cert_reqs=Required"):  # fmt: skip
        done = run(tmp_path, "cache", "dir", "--cache", url)
        assert done.returncode == 0 and done.stdout.strip() == url, (url, done.stderr)


# -- 3. an -o that cannot be written, refused before anything compiles --------------------
@pytest.mark.parametrize("name", ["x.cubin", "x.fatbin"])
def test_an_output_folder_that_takes_no_file_is_refused_before_compiling(
    tmp_path: Path, name: str
) -> None:
    # /proc takes no new file, not even from root (permission bits would not say so).
    cache = tmp_path / "c"
    done = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", f"/proc/{name}",
               "--cache", str(cache))  # fmt: skip
    line = one_line_error(done, "cuforge compile")
    assert line == (
        f"cuforge compile: error: -o: cannot write /proc/{name}: No such file or directory"
    ), line
    assert not cache.exists()  # nothing compiled, nothing stored (not even the cache made)
    done = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--outdir", "/proc/sys",
               "--cache", str(cache))  # fmt: skip
    line = one_line_error(done, "cuforge compile")
    assert line.startswith(
        "cuforge compile: error: --outdir /proc/sys: cannot write /proc/sys/saxpy.cubin: "
    ), line
    assert not cache.exists()


def test_a_read_only_mount_is_refused_before_compiling(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.cubin").write_bytes(b"old")
    cache = tmp_path / "c"
    for target in (out / "new.cubin", out / "old.cubin"):  # a new file; one written over
        done = read_only_run(out, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(target),
                             "--cache", str(cache))  # fmt: skip
        line = one_line_error(done, "cuforge compile")
        assert line == f"cuforge compile: error: -o: cannot write {target}: Read-only file system"
        assert not cache.exists()
    assert sorted(p.name for p in out.iterdir()) == ["old.cubin"]
    assert (out / "old.cubin").read_bytes() == b"old"


def test_the_check_is_honest_and_leaves_nothing_behind(tmp_path: Path) -> None:
    # Mode 0555: a user cannot add a file, root can -- the check tries, it does not guess.
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o555)
    try:
        done = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                   str(out / "k.cubin"), "--cache", str(tmp_path / "c"))  # fmt: skip
        if os.geteuid() == 0:
            assert done.returncode == 0, done.stderr
            assert [p.name for p in out.iterdir()] == ["k.cubin"]  # no probe file left
        else:
            line = one_line_error(done, "cuforge compile")
            assert line.endswith(f"-o: cannot write {out / 'k.cubin'}: Permission denied")
            assert not (tmp_path / "c").exists() and not list(out.iterdir())
    finally:
        out.chmod(0o755)
    work = tmp_path / "w"
    work.mkdir()
    shutil.copy(SAXPY, work / "saxpy.cu")
    done = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "--cache",
               str(tmp_path / "c2"), cwd=work)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in work.iterdir()) == ["saxpy.cu", "saxpy.cubin"]


# -- 4. control characters in names ----------------------------------------------------------
def _bytes_run(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """``cuforge ARGS`` with stdout and stderr as bytes (``text=True`` would turn a
    carriage return into a newline)."""
    return subprocess.run([str(SCRIPT), *args], capture_output=True, cwd=cwd,
                          env=isolated_env(home), timeout=240)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "shown"),
    [("nl\nx.cu", b"nl\\nx.cu"), ("t\tx.cu", b"t\\tx.cu"), ("cr\rx.cu", b"cr\\rx.cu"),
     ("esc\x1b[31mx.cu", b"esc\\x1b[31mx.cu")],
    ids=["newline", "tab", "carriage return", "escape"],
)  # fmt: skip
def test_a_name_with_a_control_character_is_one_escaped_field_of_one_line(
    tmp_path: Path, name: str, shown: bytes
) -> None:
    work = tmp_path / "w"
    work.mkdir()
    shutil.copy(SAXPY, work / name)
    cache = str(tmp_path / "c")
    stem = shown[: -len(b".cu")]
    for said in (b"cache miss", b"cache hit"):  # the full path, then the fast hit path
        done = _bytes_run(tmp_path, "compile", name, "--arch", "sm_90", "--cache", cache,
                          cwd=work)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.count(b"\n") == 1, done.stdout
        assert done.stdout.startswith(shown + b" -> " + stem + b".cubin (cubin, sm_90, "), done
        assert said in done.stdout
    listed = _bytes_run(tmp_path, "cache", "ls", "--cache", cache, cwd=work).stdout
    assert listed.count(b"\n") == 1, listed  # piped: one tab-separated line per entry
    fields = listed.rstrip(b"\n").split(b"\t")
    assert len(fields) == 9 and fields[7] == shown, fields
    as_json = _bytes_run(tmp_path, "cache", "ls", "--json", "--cache", cache, cwd=work).stdout
    assert json.loads(as_json)[0]["name"] == name  # --json keeps the exact name
    shown_entry = _bytes_run(tmp_path, "cache", "show", fields[0].decode(), "--cache", cache,
                             cwd=work).stdout  # fmt: skip
    assert b"\nname            " + shown + b"\n" in shown_entry, shown_entry
    folder = str(tmp_path / f"dir-{name}")  # a cache directory so named
    done = _bytes_run(tmp_path, "cache", "dir", "--cache", folder, cwd=work)
    assert done.stdout == str(tmp_path).encode() + b"/dir-" + shown + b"\n", done  # one line
    done = _bytes_run(tmp_path, "cache", "dir", "--json", "--cache", folder, cwd=work)
    assert json.loads(done.stdout)["cache"] == folder
    gone = name.replace(".cu", "-gone.cu")
    done = _bytes_run(tmp_path, "compile", gone, "--arch", "sm_90", "--cache", cache, cwd=work)
    assert done.returncode == 2 and done.stderr == (
        b"cuforge compile: error: cannot read " + stem + b"-gone.cu: No such file or directory\n"
    ), done.stderr


def test_printed_escapes_every_line_breaking_character_and_keeps_the_rest() -> None:
    from cuforge._names import printed

    plain = "kü 核.cu"
    assert printed(plain) is plain  # nothing changes for an ordinary name
    assert printed("a\u00a0b.cu") == "a\u00a0b.cu"  # not printable, but no line break
    assert printed("k\udcfc\n.cu") == "k\\xfc\\n.cu"  # an undecodable byte and a newline
    assert printed("c1\x85 del\x7f nul\x00 ls\u2028") == "c1\\x85 del\\x7f nul\\x00 ls\\u2028"
    assert "\n".join(printed(n) for n in ("a\nb", "c\rd")).splitlines() == ["a\\nb", "c\\rd"]
