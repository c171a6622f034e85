"""``cuforge run``: the real console script running real child processes -- the
job's exit status and signals, its environment and start-up hook, usage errors,
and the warm set published periodically and at the end (a real redis-server)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from _cli import SCRIPT, isolated_env, one_line_error, run
from cuforge.integrations import warmsets
from cuforge.storage.urls import open_cache

PY = sys.executable


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_the_jobs_exit_status_is_passed_through(tmp_path) -> None:
    job = _script(tmp_path, "import sys; sys.exit(3)")
    result = run(tmp_path, "run", "--cache", str(tmp_path / "c"), "--", PY, job)
    assert result.returncode == 3, result.stderr
    ok = run(tmp_path, "run", "--cache", str(tmp_path / "c"), "--", PY, "-c", "pass")
    assert ok.returncode == 0, ok.stderr


def test_a_job_ended_by_a_signal_exits_128_plus_it(tmp_path) -> None:
    job = _script(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    result = run(tmp_path, "run", "--cache", str(tmp_path / "c"), "--", PY, job)
    assert result.returncode == 128 + signal.SIGKILL, result.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "a command is required"),
        (["--"], "a command is required"),
        (["--", "/nonexistent/cmd"], "/nonexistent/cmd: command not found"),
        (["--warm-set", "a\nb", "--", "true"], "--warm-set: warm set name"),
        (["--cache", "bogus://x", "--", "true"], "--cache"),
        (["--publish-every", "soon", "--", "true"], "--publish-every"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args: list[str], says: str) -> None:
    result = run(tmp_path, "run", *args)
    line = one_line_error(result, "cuforge run")
    assert says in line, line


def test_the_job_is_wired_to_the_chosen_cache(tmp_path) -> None:
    job = _script(
        tmp_path,
        """
        import os, sys
        from cuforge.integrations import _bootstrap
        print(os.environ["CUFORGE_CACHE"])
        print(os.environ["CUFORGE_TRITON_CACHE"], os.environ["CUFORGE_JAX_CACHE"])
        print(os.environ["TRITON_CACHE_MANAGER"])
        print(os.environ["TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"])
        print(bool(_bootstrap._started))
        print(os.environ.get("CUFORGE_WARM"))
        """,
    )
    cache = tmp_path / "c"
    result = run(tmp_path, "run", "--cache", str(cache), "--warm", "--", PY, job)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [
        str(cache),
        f"{cache} {cache}",
        "cuforge.integrations.triton:CuforgeCacheManager",
        "1",
        "True",  # the start-up hook ran in the job's Python
        "1",
    ]


def test_a_settings_files_secret_reaches_the_job_and_signs_its_cache(tmp_path) -> None:
    """The secret of a settings file's ``secret_file`` reaches the job as the file's
    path, ``$CUFORGE_CACHE_SECRET_FILE`` -- never as the secret in its environment (nor
    in the command line's own, for children to inherit) -- so the job signs what it
    stores."""
    secret = "a-team-secret-of-at-least-32-bytes!!"
    (tmp_path / "secret").write_text(secret + "\n")
    (tmp_path / "cuforge.toml").write_text('cache = "c"\nsecret_file = "secret"\n')
    job = _script(
        tmp_path,
        """
        import os
        from cuforge.storage.config import default_cache
        print(os.environ["CUFORGE_CACHE_SECRET_FILE"])
        print(os.environ.get("CUFORGE_CACHE_SECRET"))
        print(type(default_cache()).__name__)
        """,
    )
    result = run(tmp_path, "run", "--", PY, job, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(tmp_path / "secret"), "None", "SignedProgramCache"]


def test_the_environments_own_sitecustomize_still_runs(tmp_path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\n")
    env = isolated_env(tmp_path, PYTHONPATH=str(site))
    code = "import os; from cuforge.integrations import _bootstrap as b; "
    code += "print(os.environ.get('THEIRS'), bool(b._started))"
    result = run(tmp_path, "run", "--cache", str(tmp_path / "c"), "--", PY, "-c", code, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ran", "True"]


def test_signals_are_passed_on_to_the_job(tmp_path) -> None:
    ready = tmp_path / "ready"
    job = _script(
        tmp_path,
        f"""
        import signal, sys, time, pathlib
        def bye(signum, frame):
            print("got", signum, flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, bye)
        signal.signal(signal.SIGUSR1, lambda s, f: print("usr1", flush=True))
        pathlib.Path({str(ready)!r}).write_text("x")
        while True:
            time.sleep(0.05)
        """,
    )
    proc = subprocess.Popen(
        [str(SCRIPT), "run", "--cache", str(tmp_path / "c"), "--", PY, job],
        env=isolated_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 7, err
    assert out.split("\n")[:2] == ["usr1", f"got {int(signal.SIGTERM)}"], out


def _recording_job(tmp_path, key: bytes, then: str) -> str:
    """A job that stores ``key`` through a Recorder on the run's journal (what the
    start-up hook gives each integration), then does ``then``."""
    return _script(
        tmp_path,
        f"""
        import os, time
        from cuforge.integrations.warmsets import Recorder
        from cuforge.storage.urls import open_cache
        journal = os.path.join(os.environ["CUFORGE_RUN_JOURNAL"], f"{{os.getpid()}}.keys")
        cache = Recorder(open_cache(os.environ["CUFORGE_CACHE"]), journal)
        cache.set_entry({key!r}, b"payload", b'{{"kind":"raw","v":1}}')
        {then}
        """,
    )


def test_the_warm_set_is_what_the_run_stored_after_a_clean_exit(tmp_path, redis_server) -> None:
    url = f"file://{tmp_path / 'local'},{redis_server.url}"
    with open_cache(redis_server.url) as shared:
        warmsets.store(shared, "job", [b"stale"])
    job = _recording_job(tmp_path, b"fresh", "pass")
    result = run(tmp_path, "run", "--cache", url, "--warm-set", "job", "--", PY, job)
    assert result.returncode == 0, result.stderr
    with open_cache(redis_server.url) as shared:
        assert warmsets.load(shared, "job") == [b"fresh"]  # replaced: exactly this run's
    failing = _recording_job(tmp_path, b"more", "raise SystemExit(1)")
    result = run(tmp_path, "run", "--cache", url, "--warm-set", "job", "--", PY, failing)
    assert result.returncode == 1
    with open_cache(redis_server.url) as shared:  # a failed run adds, never shrinks
        assert sorted(warmsets.load(shared, "job") or []) == [b"fresh", b"more"]


def test_a_killed_run_has_published_periodically(tmp_path, redis_server) -> None:
    url = f"file://{tmp_path / 'local'},{redis_server.url}"
    job = _recording_job(tmp_path, b"early", "time.sleep(120)")
    proc = subprocess.Popen(
        [str(SCRIPT), "run", "--cache", url, "--warm-set", "job", "--publish-every", "200ms",
         "--", PY, job],
        env=isolated_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        with open_cache(redis_server.url) as shared:
            while warmsets.load(shared, "job") != [b"early"]:
                assert proc.poll() is None and time.monotonic() < deadline, "never published"
                time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and its job, with no last publish
        proc.wait()


def test_a_warm_set_is_prefetched_before_the_job_starts(tmp_path, redis_server) -> None:
    with open_cache(redis_server.url) as shared:
        for i in range(20):
            shared.set_entry(f"k{i}".encode(), b"v" * 100, b'{"kind":"raw","v":1}')
        warmsets.store(shared, "job", [f"k{i}".encode() for i in range(20)])
    local = tmp_path / "local"
    job = _script(
        tmp_path,
        f"""
        from cuforge.storage.urls import open_cache
        with open_cache({str(local)!r}, read_only=True) as alone:
            found = alone.get_entries([f"k{{i}}".encode() for i in range(20)])
        print(sum(e is not None for e in found))
        """,
    )
    url = f"file://{local},{redis_server.url}"
    result = run(tmp_path, "run", "--cache", url, "--warm-set", "job", "--", PY, job)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "20"


def _venv_without_cuforge(tmp_path) -> str:
    """Another Python: a fresh virtual environment of this interpreter's base, with
    nothing installed (no cuforge, no JIT)."""
    where = tmp_path / "other-venv"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    assert python.exists()
    return str(python)


def test_a_job_python_without_cuforge_is_said_once_and_the_job_runs(tmp_path) -> None:
    """``cuforge run -- /other/venv/bin/python job.py`` where that Python has no cuforge:
    the job runs unwired (its exit status kept), and ``cuforge run`` says so in one
    line -- not one line from every Python process of the job."""
    other = _venv_without_cuforge(tmp_path)
    job = _script(
        tmp_path,
        """
        import subprocess, sys
        subprocess.run([sys.executable, "-c", "print('child ran')"], check=True)
        print("job ran"); sys.exit(5)
        """,
    )
    result = run(tmp_path, "run", "--cache", str(tmp_path / "c"), "--", other, job)
    assert result.returncode == 5, result.stderr
    assert result.stdout.split("\n")[:2] == ["child ran", "job ran"]
    said = [line for line in result.stderr.splitlines() if "cannot import cuforge" in line]
    assert len(said) == 1, result.stderr
    assert said[0].startswith(f"cuforge run: {other} cannot import cuforge")
    assert "not wired" in said[0] and "install cuforge" in said[0]


def test_this_python_is_not_asked_about_itself(tmp_path) -> None:
    result = run(tmp_path, "run", "--cache", str(tmp_path / "c"), "--", PY, "-c", "print(1)")
    assert result.returncode == 0 and result.stdout.strip() == "1"
    assert "cuforge run:" not in result.stderr, result.stderr
