"""The tenth newcomer pass, second part (issue 36: every message true): each test
runs the installed ``cuforge`` console script in a subprocess on real servers and
fails on the main it was written against.

- 3. an S3 bucket the server refuses (an invalid name: ``400 InvalidBucketName``)
  made a compile end ``not stored: unreachable`` although the server had answered:
  any 4xx refusal but throttling is an answer, so the store is ``failed`` and the
  detail quotes the server's error code and message.
"""

from __future__ import annotations

import json

from _cli import SAXPY, run


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
