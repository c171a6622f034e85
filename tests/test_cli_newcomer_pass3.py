"""The third newcomer pass over the README and docs (issue 36): each test runs the
installed ``cuforge`` console script in a subprocess, on real caches filled by real
NVRTC compiles, and fails on the main it was written against.

- A symbolic link where a shard belongs (``ln -s /etc/passwd CACHE/entries/ab``) made
  every command on the cache exit 2, ``compile`` included: it is a foreign object now.
- ``cache verify`` said ``entries/cd: a file where a cache file belongs`` for a file
  standing where a shard directory belongs.
- ``cache show ID --extract ''`` wrote nothing and exited 0; ``--extract nodir/k.cubin``
  and ``--extract DIR`` printed every detail, then failed; ``--extract saxpy.cu``
  wrote over the source.
- A compile through a read-only mount said ``not stored: failed`` where cli.md lists
  ``read-only``, and its warning said later failures are counted in ``cuforge cache
  stats (write failures)``, which showed 0: a read-only cache records no counter.
- ``CUFORGE_CACHE=file:// cuforge cache dir`` (``sqlite://``, ``redis://h:port``)
  printed the URL, exit 0, while compile refused it; ``cache stats`` said ``there is
  no cache at  (nothing was created)``.
- ``cuforge warm --set job1 --cache ./nothere`` made a whole new cache at the mistyped
  path before saying no set was stored.
- The 'no warm set' hint printed the name unquoted: ``(cuforge run --warm-set bad
  name/../ records one ...)``, a command that records another set.
- ``max_size = "-1G"`` in cuforge.toml said ``not a size: '-1G' (expected e.g. 500M...)``
  where ``--max-size -1G`` says ``-1G is negative: give a value above zero``; now both
  (and a URL's ``?max_size=-1G``) say ``give a size above zero``.
- A warm manifest holding only ``kernel = 5`` said ``no [[kernel]] tables``, as an
  empty one does; a single ``[kernel]`` table said so too.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

from _cli import SAXPY, isolated_env, one_line_error, read_only_run, run
from reliability._figures import record


def _filled(tmp_path: Path, arch: str = "sm_90") -> Path:
    """A directory cache holding saxpy.cu's cubin for ``arch``."""
    cache = tmp_path / "cache"
    built = run(tmp_path, "compile", str(SAXPY), "--arch", arch, "-o",
                str(tmp_path / f"{arch}.cubin"), "--cache", str(cache))  # fmt: skip
    assert built.returncode == 0, built.stderr
    return cache


def _shard_of(cache: Path) -> Path:
    """The one shard directory of a cache holding one entry."""
    (shard,) = (p for p in (cache / "entries").iterdir() if p.is_dir() and not p.is_symlink())
    return shard


# -- 2. verify names what belongs where ----------------------------------------------------
def test_verify_says_a_shard_directory_belongs_where_a_file_stands(tmp_path: Path) -> None:
    """A file at a shard's name was ``a file where a cache file belongs``; a FIFO at an
    entry file's name is said to stand where an entry file belongs."""
    cache = _filled(tmp_path)
    (cache / "entries" / "cd").write_text("hi\n")
    shard = _shard_of(cache)
    fifo = shard / ("f" * 62)
    os.mkfifo(fifo)
    result = run(tmp_path, "cache", "verify", "--cache", str(cache))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "entries/cd: a file where a shard directory belongs" in lines, result.stdout
    assert f"entries/{shard.name}/{fifo.name}: a FIFO where an entry file belongs" in lines
    assert "cache file" not in result.stdout
    fixed = run(tmp_path, "cache", "verify", "--fix", "--json", "--cache", str(cache))
    report = json.loads(fixed.stdout)
    assert sorted(f["path"] for f in report["foreign"]) == sorted(
        ["entries/cd", f"entries/{shard.name}/{fifo.name}"]
    )
    assert report["removed"] == 2 and not (cache / "entries" / "cd").exists()
    record(
        "use", "cli", "cache verify with a file where a shard directory belongs and a FIFO "
        "where an entry file belongs", 2,
        "'entries/cd: a file where a shard directory belongs', '.../fff...: a FIFO where an "
        "entry file belongs'; --fix removed both (before: 'where a cache file belongs' for "
        "each)", scale="all",
    )  # fmt: skip


# -- 1. a link where a shard belongs is a foreign object, not a refusal -------------------
def test_a_link_for_a_shard_is_never_followed_and_never_fails_a_command(tmp_path: Path) -> None:
    """``ln -s /etc/passwd CACHE/entries/ab`` made every command exit 2 (compile too),
    ``cache directory .../entries/ab: is a symbolic link``; verify could not list it."""
    cache = _filled(tmp_path)
    shard = _shard_of(cache)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.rename(shard, outside / shard.name)  # the entry, whole, now outside the cache
    shard.symlink_to(outside / shard.name, target_is_directory=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("not the cache's\n")
    other = "ab" if shard.name != "ab" else "cd"
    (cache / "entries" / other).symlink_to(victim)
    before = {p: p.read_bytes() for p in (outside / shard.name).iterdir()}
    for args in (("cache", "ls"), ("cache", "stats"), ("cache", "ls", "--json")):
        result = run(tmp_path, *args, "--cache", str(cache))
        assert result.returncode == 0, (args, result.stderr)
        assert "symbolic link" not in result.stderr, result.stderr
    assert json.loads(result.stdout) == []  # the entry behind the link is not the cache's
    listed = run(tmp_path, "cache", "verify", "--cache", str(cache))
    assert listed.returncode == 1, listed.stdout + listed.stderr
    assert sorted(listed.stdout.splitlines()[:2]) == sorted(
        f"entries/{name}: a symbolic link where a shard directory belongs"
        for name in (shard.name, other)
    ), listed.stdout
    out = tmp_path / "again.cubin"
    built = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(out),
                "--cache", str(cache))  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert "cache miss (compiled and stored in" in built.stdout, built.stdout
    assert out.read_bytes() == (tmp_path / "sm_90.cubin").read_bytes()
    assert shard.is_dir() and not shard.is_symlink()  # the link replaced, not written through
    assert {p: p.read_bytes() for p in (outside / shard.name).iterdir()} == before
    fixed = run(tmp_path, "cache", "verify", "--fix", "--cache", str(cache))
    assert fixed.returncode == 1, fixed.stdout + fixed.stderr
    assert fixed.stdout.endswith("1 foreign object, 1 removed\n"), fixed.stdout
    assert not os.path.lexists(cache / "entries" / other)
    assert victim.read_text() == "not the cache's\n"
    assert run(tmp_path, "cache", "verify", "--cache", str(cache)).returncode == 0
    hit = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(out),
              "--cache", str(cache))  # fmt: skip
    assert "cache hit" in hit.stdout, hit.stdout
    record(
        "inputs", "cli", "links where shards belong (one to a copy of the entry outside the "
        "cache, one to a file): ls, ls --json, stats, verify, compile, verify --fix", 6,
        "none exits 2; ls lists nothing behind the link; verify names both 'a symbolic link "
        "where a shard directory belongs'; compile misses and its store replaces the link (the "
        "outside copy byte-identical); --fix removes the other link, its target untouched "
        "(before: every command exit 2, 'cache directory .../entries/ab: is a symbolic link')",
        scale="all",
    )  # fmt: skip


# -- 3. show --extract checks OUT first, and never writes over a file unasked ------------
def test_extract_checks_its_output_first_and_keeps_existing_files(tmp_path: Path) -> None:
    """``--extract ''`` was silently ignored (exit 0), a missing folder or a directory
    failed only after every detail was printed, and an existing source was overwritten."""
    cache = _filled(tmp_path)
    (entry,) = json.loads(run(tmp_path, "cache", "ls", "--json", "--cache", str(cache)).stdout)
    source = tmp_path / "saxpy.cu"
    shutil.copy(SAXPY, source)
    prog = "cuforge cache show"
    refused = {
        "": "--extract needs a file name (it was given an empty one); - is standard output",
        str(tmp_path / "nodir" / "k.cubin"): f"the directory {tmp_path / 'nodir'} does not exist",
        str(tmp_path): "is a directory; name a file",
        str(source): "the file exists; give --force to write over it",
    }
    for out, said in refused.items():
        result = run(tmp_path, "cache", "show", entry["id"], "--extract", out, "--cache",
                     str(cache))  # fmt: skip
        line = one_line_error(result, prog)  # one line: no details printed before it
        assert line.endswith(said), (out, line)
        assert result.stdout == ""
    assert source.read_bytes() == SAXPY.read_bytes()
    assert not (tmp_path / "nodir").exists()
    forced = run(tmp_path, "cache", "show", entry["id"], "--extract", str(source), "--force",
                 "--cache", str(cache))  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    assert source.read_bytes() == (tmp_path / "sm_90.cubin").read_bytes()
    record(
        "inputs", "cli", "cache show --extract '', into a missing folder, a directory, an "
        "existing source file; then that file with --force", 5,
        "each refusal: exit 2, one line naming --extract and what to do, nothing printed "
        "before it, the source byte-identical; --force wrote the payload (before: '' exit 0 "
        "writing nothing, the folder and directory refused after every detail, the source "
        "overwritten)", scale="all",
    )  # fmt: skip


# -- 4. a read-only mount: "read-only", and no promise of counters it cannot keep --------
def test_a_read_only_mount_says_read_only_and_promises_no_counts(tmp_path: Path) -> None:
    """``not stored: failed``, and a warning promising ``cuforge cache stats (write
    failures)`` counts that ``stats`` then showed as 0."""
    cache = _filled(tmp_path, "sm_80")
    args = ("compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "y.cubin"),
            "--cache", str(cache))  # fmt: skip
    for _ in range(2):
        result = read_only_run(cache, *args)
        assert result.returncode == 0, result.stderr
        assert result.stdout.endswith("cache miss (compiled; not stored: read-only)\n")
        (warning,) = result.stderr.splitlines()
        assert warning == (
            f"cuforge: warning: program cache {cache}: could not store an entry "
            "(Read-only file system); the result is still returned, only not cached. The "
            "cache still serves hits; later stores of this handle are dropped without a "
            "warning, and nothing is recorded on a read-only file system, counters included."
        ), warning
    reported = json.loads(read_only_run(cache, *args, "--json").stdout)
    assert reported[0]["not_stored"] == "read-only"
    assert [lv["reason"] for lv in reported[0]["levels"]] == ["read-only"]
    stats = json.loads(read_only_run(cache, "cache", "stats", "--json", "--cache", str(cache))
                       .stdout)  # fmt: skip
    assert stats["write_failures"] == 0  # what the warning said: nothing recorded there
    record(
        "use", "cli", "compile through a read-only bind mount (text twice, --json), then cache "
        "stats", 4,
        "'not stored: read-only' (--json not_stored and the level's reason 'read-only'); the "
        "warning says nothing is recorded there, counters included, and stats shows 0 write "
        "failures (before: 'not stored: failed', and a warning promising the failures in "
        "cuforge cache stats)", scale="all",
    )  # fmt: skip


# -- 5. every command refuses a cache URL that cannot open, in the same words ----------------
URLS = {
    "file://": "file:// needs a directory (file:///path/to/cache)",
    "sqlite://": "sqlite:// needs a database file (sqlite:///path/to/cache.db)",
    "redis://h:port": "port 'port' is not a number",
}


def test_a_url_that_cannot_open_is_refused_by_cache_dir_and_stats(tmp_path: Path) -> None:
    """``cache dir`` printed the URL (exit 0) and ``stats`` blamed an empty path."""
    checked = 0
    for url, reason in URLS.items():
        env = isolated_env(tmp_path, CUFORGE_CACHE=url)
        said = f"$CUFORGE_CACHE: cache URL {url!r}: {reason}"
        compiled = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                       str(tmp_path / "k.cubin"), env=env)  # fmt: skip
        assert one_line_error(compiled, "cuforge compile").endswith(said)
        for args in (("cache", "dir"), ("cache", "dir", "--json"), ("cache", "stats")):
            line = one_line_error(run(tmp_path, *args, env=env), f"cuforge {' '.join(args[:2])}")
            assert line == f"cuforge {' '.join(args[:2])}: error: {said}", (url, args, line)
            checked += 1
    assert not (tmp_path / "xdg").exists()  # no default cache made instead
    record(
        "inputs", "cli", "CUFORGE_CACHE=file://, sqlite://, redis://h:port x cache dir, dir "
        "--json, stats", checked,
        "each: exit 2, one line with compile's words (file:// needs a directory, port 'port' is "
        "not a number; before: dir printed the URL, exit 0, and stats said 'there is no cache "
        "at  (nothing was created)')", scale="all",
    )  # fmt: skip


# -- 6. warm --set on a cache that is not there creates nothing -------------------------
def test_warm_set_on_a_missing_cache_creates_nothing(tmp_path: Path) -> None:
    """A mistyped ``--cache`` path became a new cache (CACHEDIR.TAG, entries/, ...)."""
    nothere = tmp_path / "nothere"
    manifest = tmp_path / "m.toml"
    manifest.write_text(f'[[kernel]]\nsource = "{SAXPY}"\narch = "sm_90"\n')
    for extra in ((), (str(manifest),)):
        result = run(tmp_path, "warm", *extra, "--set", "job1", "--cache", str(nothere))
        assert result.returncode == 1, result.stdout + result.stderr
        assert result.stderr == (
            f"cuforge warm: no warm set 'job1' is stored in {nothere}: there is no cache at "
            f"{nothere} (nothing was created; cuforge run --warm-set job1 records one from a "
            "job that reads or stores entries through this cache)\n"
        ), result.stderr
        assert not nothere.exists()
    cache = _filled(tmp_path)  # an existing cache says only that the set is not there
    there = run(tmp_path, "warm", "--set", "job1", "--cache", str(cache))
    assert there.returncode == 1 and "there is no cache" not in there.stderr, there.stderr
    assert f"no warm set 'job1' is stored in {cache} (cuforge run" in there.stderr
    record(
        "inputs", "cli", "warm --set job1 (with and without a manifest) --cache at a path "
        "that does not exist", 2,
        "exit 1, 'no warm set ... there is no cache at PATH (nothing was created ...)', the "
        "path still absent (before: a new cache made there first)", scale="all",
    )  # fmt: skip


# -- 7. the hint's command is one a shell runs as written --------------------------------
def test_the_no_set_hint_quotes_the_name_as_a_shell_reads_it(tmp_path: Path) -> None:
    """``cuforge run --warm-set bad name/../ records one``: pasted, that command names
    the set ``bad`` and runs ``name/../``."""
    cache = _filled(tmp_path)
    name = "bad name/../"
    result = run(tmp_path, "warm", "--set", name, "--cache", str(cache))
    assert result.returncode == 1, result.stdout + result.stderr
    hint = result.stderr.split(" (", 1)[1].split(" records one", 1)[0]
    assert hint == "cuforge run --warm-set 'bad name/../'", result.stderr
    assert shlex.split(hint)[-1] == name  # the set the warning is about
    # run records under that very name (the same rule accepts and refuses names)
    done = run(tmp_path, "run", "--warm-set", name, "--cache", str(cache), "--", "true")
    assert done.returncode == 0, done.stderr
    for refused in ("a\nb", " "):
        warm = one_line_error(run(tmp_path, "warm", "--set", refused, "--cache", str(cache)),
                              "cuforge warm")  # fmt: skip
        ran = one_line_error(run(tmp_path, "run", "--warm-set", refused, "--cache", str(cache),
                                 "--", "true"), "cuforge run")  # fmt: skip
        assert warm.split("warm set name: ")[1] == ran.split("warm set name: ")[1]
    record(
        "inputs", "cli", "warm --set 'bad name/../' on a cache without that set; warm --set and "
        "run --warm-set with the names run refuses", 5,
        "the hint reads cuforge run --warm-set 'bad name/../' (shlex gives back the name); both "
        "commands refuse the same names in the same words (before: the name unquoted)",
        scale="all",
    )  # fmt: skip


# -- 8. a negative size is said the same way wherever it was written ---------------------
def test_a_negative_size_is_said_alike_in_a_flag_a_settings_file_and_a_url(
    tmp_path: Path,
) -> None:
    """The settings file's ``max_size = "-1G"`` was "not a size", the flag's "negative"."""
    project, env = tmp_path / "project", isolated_env(tmp_path)
    project.mkdir()
    (project / "cuforge.toml").write_text('max_size = "-1G"\n')
    out = ("-o", str(tmp_path / "k.cubin"))
    said = "-1G is negative: give a size above zero, such as 1G"
    lines = {
        "settings": one_line_error(run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", *out,
                                       cwd=project, env=env), "cuforge compile"),
        "flag": one_line_error(run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", *out,
                                   "--max-size", "-1G"), "cuforge compile"),
        "flag=": one_line_error(run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", *out,
                                    "--max-size=-1G"), "cuforge compile"),
        "url": one_line_error(run(tmp_path, "cache", "dir", env=isolated_env(
            tmp_path, CUFORGE_CACHE=f"file://{tmp_path / 'c'}?max_size=-1G")), "cuforge cache dir"),
    }  # fmt: skip
    assert lines["settings"] == (
        f"cuforge compile: error: max_size in project config {project / 'cuforge.toml'}: {said}"
    )
    for where in ("flag", "flag="):
        assert f"argument --max-size: {said} (see" in lines[where], lines[where]
    assert lines["url"].endswith(f"?max_size=-1G': max_size: {said}"), lines["url"]
    assert not (tmp_path / "k.cubin").exists()
    record(
        "inputs", "cli", "max_size = \"-1G\" in cuforge.toml; --max-size -1G and --max-size=-1G; "
        "?max_size=-1G in $CUFORGE_CACHE", 4,
        "each: exit 2, one line '-1G is negative: give a size above zero, such as 1G' after "
        "the file, flag or URL (before: the settings file and the URL said 'not a size: "
        "'-1G' (expected e.g. 500M, 2G, 64KiB)')", scale="all",
    )  # fmt: skip


# -- 9. a manifest's wrong type is named in TOML's words --------------------------------------
KERNELS = {
    "kernel = 5": "m.toml: kernel must be an array of tables, each a [[kernel]] naming a "
    "source; got an integer (5)",
    'kernel = "saxpy.cu"': "m.toml: kernel must be an array of tables, each a [[kernel]] "
    'naming a source; got a string ("saxpy.cu")',
    '[kernel]\nsource = "saxpy.cu"': "m.toml: kernel must be an array of tables, each a "
    "[[kernel]] naming a source; got a table ([kernel]: write [[kernel]])",
    "kernel = [1]": "m.toml kernel 1 must be a table, got an integer (1)",
    "defaults = 5\n[[kernel]]\nsource = 'saxpy.cu'": "m.toml [defaults] must be a table, got "
    "an integer (5)",
    "": "m.toml: no [[kernel]] tables (each names a source)",
}


def test_a_manifests_wrong_types_are_named(tmp_path: Path) -> None:
    """``kernel = 5`` said ``no [[kernel]] tables``, the words of an empty manifest."""
    shutil.copy(SAXPY, tmp_path / "saxpy.cu")
    for text, said in KERNELS.items():
        (tmp_path / "m.toml").write_text(text + "\n")
        result = run(tmp_path, "warm", "m.toml", "--cache", str(tmp_path / "c"), cwd=tmp_path)
        assert one_line_error(result, "cuforge warm") == f"cuforge warm: error: {said}", text
    assert not (tmp_path / "c").exists()
    record(
        "inputs", "cli", "warm manifests: kernel = 5, kernel = \"saxpy.cu\", one [kernel] table, "
        "kernel = [1], defaults = 5, an empty file", len(KERNELS),
        "each: exit 2, one line naming the key and what it is in TOML's words (an integer (5), "
        "a table ([kernel]: write [[kernel]])); the empty file alone 'no [[kernel]] tables' "
        "(before: that for the first three too, and 'must be a table' with no type)",
        scale="all",
    )  # fmt: skip
