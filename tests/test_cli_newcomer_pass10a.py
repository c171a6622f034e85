"""The tenth newcomer pass, second part (issue 36: every message true): each test
runs the installed ``cuforge`` console script in a subprocess on real servers and
fails on the main it was written against.

- 2. a ``redis://:PASSWORD@`` URL on a server without a password: ``doctor``,
  ``cache stats`` and ``cache ls`` (redis-py, RESP3: ``HELLO 3 AUTH default PW``,
  which such a server accepts) said all was well while every compile (the hit path's
  ``AUTH PW``: "called without any password configured") warned and stored nothing.
  Both clients now authenticate alike: doctor lists the problem, stats and ls fail
  with it, compile warns with it.
- 3. an S3 bucket the server refuses (an invalid name: ``400 InvalidBucketName``)
  made a compile end ``not stored: unreachable`` although the server had answered:
  any 4xx refusal but throttling is an answer, so the store is ``failed`` and the
  detail quotes the server's error code and message.
"""

from __future__ import annotations

import json

from _cli import SAXPY, run

NO_PASSWORD = "AUTH <password> called without any password configured"


def test_a_password_a_redis_server_does_not_have_is_a_problem_everywhere(tmp_path, redis_server):
    url = redis_server.url.replace("redis://", "redis://:pw@")
    doctor = run(tmp_path, "doctor", "--cache", url)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    problems = [line for line in doctor.stdout.splitlines() if line.startswith("problem")]
    assert any(NO_PASSWORD in line for line in problems), doctor.stdout
    assert "exists            yes" not in doctor.stdout, doctor.stdout
    for args, what in ((("cache", "stats"), "could not read statistics"),
                       (("cache", "ls"), "could not list entries")):  # fmt: skip
        done = run(tmp_path, *args, "--cache", url)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        [line] = done.stderr.strip().splitlines()
        assert what in line and NO_PASSWORD in line, line
    made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_75",
               "-o", str(tmp_path / "o.cubin"), "--cache", url)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert NO_PASSWORD in made.stderr, made.stderr
    assert "not stored: failed" in made.stdout + made.stderr
    assert redis_server.client().dbsize() == 0  # nothing was written by anyone


def test_a_bucket_the_server_refuses_is_failed_not_unreachable(tmp_path, s3_server, s3_url):
    url = s3_server.url(bucket="Bad_Bucket")  # s3_url: the server's credentials
    out = str(tmp_path / "o.cubin")
    done = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_89", "-o", out, "--json",
               "--cache", url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [result] = json.loads(done.stdout)
    assert result["not_stored"] == "failed"
    [level] = result["levels"]
    assert level["reason"] == "failed"
    assert "InvalidBucketName" in level["detail"], level["detail"]
    assert "the server refused the request (400" in level["detail"], level["detail"]
    text = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_89", "-o", out, "--cache", url)
    assert text.returncode == 0, text.stderr
    said = text.stdout + text.stderr
    assert "cache miss (compiled; not stored: failed)" in said, said
    assert "unreachable" not in said, said
