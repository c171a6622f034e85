"""The README's command-line session is true: every ``$`` command in it runs, in the
order shown, on a pseudo-terminal (as a person sees it: tables with headers), and
every output line shown is printed -- with times, sizes, dates, entry ids and compiler
versions free to differ, and counts, names, archs, words and paths exact.

A line ``...`` in the README stands for lines left out; otherwise the command must
print exactly the lines shown (in any order: ``cache ls`` sorts by last use, and
entries stored in the same instant tie)."""

from __future__ import annotations

import os
import pty
import re
import shutil
import subprocess
import time
from pathlib import Path

from _cli import EXAMPLES, ROOT, SCRIPT, isolated_env

README = ROOT / "README.md"
PLACE = "/tmp/readme"  # where the README's session ran; the test runs it in tmp_path
SETUP = f"$ cp -r examples {PLACE} && cd {PLACE} && export CUFORGE_CACHE=$PWD/cache"

# What may differ between machines and runs, as (pattern in the README, regex).
_VARYING = [
    (r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"),  # a date
    (r"\d+(?:\.\d+)? ms\b", r"\d+(?:\.\d+)? ms"),  # a time
    (r"\bin \d+(?:\.\d+)? s\b", r"in \d+(?:\.\d+)? s"),
    (r"\b\d+[smhd] ago\b", r"(?:\d+[smhd]|-) ago"),
    (r"\b\d+(?:\.\d+)? (?:bytes|B|KiB|MiB)\b", r"\d+(?:\.\d+)? (?:bytes|B|KiB|MiB)"),
    (r"\(\d+ jobs?\)", r"\(\d+ jobs?\)"),  # the default is the number of CPUs
    (r"\bnvrtc \d+\.\d+\b", r"nvrtc \d+\.\d+"),  # the compiler's version...
    (r"\b[0-9a-f]{8,64}\b", r"[0-9a-f]{8,64}"),  # ...build id, and entry ids
    (r"(?<= )\d+\.\d\d$", r"\d+\.\d\d"),  # warm's SECONDS column
]
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _session() -> list[tuple[str, list[str]]]:
    """(command, the output lines shown) for each ``$`` line of the README's session."""
    text = README.read_text()
    assert text.count("```\n" + SETUP + "\n") == 1, "the README's session has moved"
    start = text.index("```\n" + SETUP + "\n") + 4
    session = text[start : text.index("```", start)]
    steps: list[tuple[str, list[str]]] = []
    for line in session.splitlines()[1:]:
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def _pattern(shown: str, tmp: Path) -> re.Pattern[str]:
    """The regex an output line must match for the README's ``shown`` line to be true."""
    parts: list[str] = []
    pos = 0
    varying = re.compile("|".join(f"(?P<v{i}>{p})" for i, (p, _) in enumerate(_VARYING)))
    for found in varying.finditer(shown):
        parts.append(re.escape(shown[pos : found.start()]))
        parts.append(_VARYING[int(found.lastgroup[1:])][1])  # type: ignore[index]
        pos = found.end()
    parts.append(re.escape(shown[pos:]))
    text = "".join(parts).replace(re.escape(PLACE), re.escape(str(tmp)))
    return re.compile(re.sub(r"(?:\\ )+", r" +", text))  # column widths may differ


def _on_terminal(command: str, cwd: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    """Run ``command`` with bash on a pseudo-terminal; its exit status and the lines a
    terminal shows (progress redrawn with carriage returns reduced to its last state)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        ["bash", "-c", command], stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
        cwd=cwd, env=env, close_fds=True,
    )  # fmt: skip
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    code = proc.wait(timeout=60)
    lines = []
    for line in seen.decode(errors="replace").replace("\r\n", "\n").split("\n"):
        line = _ANSI.sub("", line.rsplit("\r", 1)[-1]).rstrip()
        if line:
            lines.append(line)
    return code, lines


def test_the_readme_session_prints_what_the_readme_shows(tmp_path):
    steps = _session()
    assert len(steps) >= 8, "the README's session lost its commands"
    here = tmp_path / "readme"
    shutil.copytree(EXAMPLES, here)  # the README's first line
    env = isolated_env(tmp_path, CUFORGE_CACHE=str(here / "cache"), NO_COLOR="1")
    env["PATH"] = f"{SCRIPT.parent}{os.pathsep}{env.get('PATH', '')}"
    for command, shown in steps:
        code, printed = _on_terminal(command, here, env)
        # ``cache explain`` exits 1 for a miss (docs/cli.md); everything else succeeds
        missed = "cache explain" in command and shown[0].startswith("miss")
        assert code == (1 if missed else 0), (command, printed)
        elided = "..." in shown
        wanted = [_pattern(line, here) for line in shown if line != "..."]
        left = list(printed)
        for shown_line, pattern in zip([s for s in shown if s != "..."], wanted, strict=True):
            match = next((p for p in left if pattern.fullmatch(p)), None)
            assert match is not None, f"{command!r} did not print {shown_line!r}:\n" + "\n".join(
                printed
            )
            left.remove(match)
        assert elided or not left, f"{command!r} printed lines the README does not show: {left}"
