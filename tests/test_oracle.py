"""The differential oracle of issue 32: random sequences of changes, and after each one
every compile path must answer exactly what an uncached compile answers then.

The changes (hypothesis rules over ``tests/_oracle_world.py``): headers edited in
place or replaced by rename (also through a symlink), directories deleted, emptied,
recreated or swapped by rename, symlinks re-pointed (``ln -sfn``), a header created
beside the source that shadows every ``-I`` directory, an optional second header
appearing or disappearing, the include path and its spelling (relative, absolute),
the working directory, ``-D``/``--std``/``--arch``, ``CUFORGE_TOOLKIT_HEADERS`` (the
environment variable the key reads: toy toolkits A and B, off), device 0's arch,
and a second process compiling into the shared caches under another header state.

The paths, after every step (``tests/_oracle.py``): the API through InMemory,
FileStream, SQLite and a memory+file tier, in this watched process and in an
unwatched child; ``cuforge -v compile`` (full path) and ``cuforge compile`` (fast
hit path); ``cuforge warm`` and a compile from what it stored.

Bounded for ``make test`` (:data:`CI`: derandomized, a fixed number of examples and
steps, about a minute on two cores); ``make test-all`` adds the soak-marked long run
(:data:`LONG`: random, more and longer sequences; ``CUFORGE_HYPOTHESIS_EXAMPLES``
scales it, ``CUFORGE_ORACLE_EXAMPLES`` sets it). The minimal sequences it found are
plain tests in ``tests/test_oracle_seeds.py``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from _oracle import PATHS, Child, Oracle, record
from _oracle_world import (
    CWDS,
    DEFINES,
    DEVICE_ARCHS,
    EXPLICIT_ARCHS,
    EXTRA_DIRS,
    HEADERS,
    INCLUDE_PATHS,
    LINKS,
    RECREATABLE,
    STDS,
    SWAPS,
    TOOLKITS,
)

_COMMON = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
#: make test: the same sequences every run (derandomized): 4 x (1 + 20) = 84 checks,
#: 60-90 s on two cores. Long sequences: a stale answer needs a change, a check
#: that trusts it, and a later change the trust misses.
CI = settings(max_examples=4, stateful_step_count=20, derandomize=True, **_COMMON)
#: make test-all (CUFORGE_HYPOTHESIS_EXAMPLES=600): 15 sequences of 25 steps.
_LONG_EXAMPLES = int(
    os.environ.get("CUFORGE_ORACLE_EXAMPLES")
    or max(4, int(os.environ.get("CUFORGE_HYPOTHESIS_EXAMPLES", "600")) // 40)
)
#: make test-all: new random sequences each run, longer ones.
LONG = settings(max_examples=_LONG_EXAMPLES, stateful_step_count=25, **_COMMON)


class Session:
    """What every example of one test shares: a base directory, the unwatched child
    process, the CLI's state directory; and counts for the summary."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.child = Child(base / "child.log")
        self.worlds = 0
        self.checks = 0
        self.seconds: dict[str, float] = {}  # per path, over every check

    def new_oracle(self) -> Oracle:
        self.worlds += 1
        return Oracle(self.base / f"world{self.worlds}", self.child, self.base / "state")


class OracleMachine(RuleBasedStateMachine):
    """Each example: a fresh world; each rule: one change; the invariant: the check."""

    session: ClassVar[Session]

    def __init__(self) -> None:
        super().__init__()
        self.oracle = self.session.new_oracle()
        self.world = self.oracle.world

    # hypothesis tries the rules in name order first: its first sequence repeats this
    # one, the simplest change every path must see.
    @rule(arch=st.sampled_from(DEVICE_ARCHS))
    def arch_of_device_0(self, arch: str) -> None:
        self.world.set(device_arch=arch)

    @rule(header=st.sampled_from(HEADERS), how=st.sampled_from(("in place", "by rename")))
    def edit_header(self, header: str, how: str) -> None:
        self.world.edit_header(header, how)

    @rule(how=st.sampled_from(("in place", "by rename")))
    def edit_header_in_use(self, how: str) -> None:
        self.world.edit_header_in_use(how)

    @rule(how=st.sampled_from(("recreate", "swap", "repoint")))
    def change_dir_in_use(self, how: str) -> None:
        self.world.change_dir_in_use(how)

    @rule(d=st.sampled_from(RECREATABLE), contents=st.sampled_from(("headers", "empty", "absent")))
    def recreate_dir(self, d: str, contents: str) -> None:
        self.world.recreate_dir(d, contents)

    @rule(pair=st.sampled_from(SWAPS))
    def swap_dirs(self, pair: tuple[str, str]) -> None:
        self.world.swap_dirs(*pair)

    @rule(link=st.sampled_from([(link, t) for link, ts in LINKS.items() for t in ts]))
    def repoint_symlink(self, link: tuple[str, str]) -> None:
        self.world.repoint(*link)

    @rule(d=st.sampled_from(EXTRA_DIRS), present=st.booleans())
    def second_header(self, d: str, present: bool) -> None:
        self.world.set_extra(d, present)

    @rule(present=st.booleans())
    def header_beside_the_source(self, present: bool) -> None:
        self.world.set_shadow(present)

    @rule(includes=st.sampled_from(INCLUDE_PATHS))
    def include_path(self, includes: tuple[str, ...]) -> None:
        self.world.set(includes=includes)

    @rule(cwd=st.sampled_from(CWDS))
    def working_directory(self, cwd: str) -> None:
        self.world.set(cwd=cwd)

    @rule(
        define=st.sampled_from(DEFINES),
        std=st.sampled_from(STDS),
        arch=st.sampled_from(EXPLICIT_ARCHS),
    )
    def options(self, define: str | None, std: str | None, arch: str | None) -> None:
        self.world.set(define=define, std=std, arch=arch)

    @rule(toolkit=st.sampled_from(TOOLKITS))
    def toolkit_headers_env(self, toolkit: str | None) -> None:
        self.world.set(toolkit=toolkit)

    @rule(header=st.sampled_from((None, *HEADERS)), restore=st.booleans())
    def second_process_writes(self, header: str | None, restore: bool) -> None:
        self.oracle.second_process_writes(header, restore)

    @invariant()
    def every_path_answers_like_an_uncached_compile(self) -> None:
        self.session.checks += 1
        self.oracle.check()

    def teardown(self) -> None:
        self.oracle.close()
        for path, seconds in self.oracle.seconds.items():
            self.session.seconds[path] = self.session.seconds.get(path, 0.0) + seconds
        w = self.world
        print(f"sequence {self.session.worlds}: " + ("; ".join(w.log) or "(no change)"))


@pytest.fixture
def session(tmp_path_factory: pytest.TempPathFactory):
    s = Session(tmp_path_factory.mktemp("oracle"))
    yield s
    s.child.close()


def _run(session: Session, config: settings, scale: str) -> None:
    OracleMachine.session = session
    start = time.perf_counter()
    try:
        run_state_machine_as_test(OracleMachine, settings=config)
    finally:
        wall = time.perf_counter() - start
        print(f"\noracle ({scale}): {session.worlds} sequences, {session.checks} checks "
              f"(the initial one of each sequence and one per step) in {wall:.0f} s; "
              + ", ".join(f"{k} {v:.0f} s" for k, v in session.seconds.items()))  # fmt: skip
    record(
        "oracle", "all", "random sequences of header, directory, symlink, include path, "
        "working directory, option, env, device arch and second-process changes",
        session.checks,
        f"{session.worlds} sequences ({'derandomized' if config.derandomize else 'random'}), "
        f"{wall:.0f} s: after every step each of {PATHS} byte-identical to an uncached "
        "compile made then (or failing with it)",
        scale=scale,
    )  # fmt: skip


@pytest.mark.timeout(1800)  # on a failure, shrinking replays many sequences
def test_every_path_equals_an_uncached_compile(session: Session) -> None:
    _run(session, CI, "ci")


@pytest.mark.soak
@pytest.mark.timeout(0)
def test_every_path_equals_an_uncached_compile_long_run(session: Session) -> None:
    _run(session, LONG, "full")
