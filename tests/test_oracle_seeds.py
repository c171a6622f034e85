"""The sequences the issue 32 oracle (tests/test_oracle.py) found, as plain tests.

Each is a minimal falsifying sequence hypothesis printed (quoted in its docstring),
replayed step by step on a fresh world: after the initial check and after each
change, every path must answer what an uncached compile answers (``Oracle.check``,
the same check the state machine's invariant makes). The state machine finds them
again by itself; these keep each one from coming back unnoticed, whatever the random
search happens to try.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from _oracle import Child, Oracle
from _oracle_world import World

Step = Callable[[World], None]


@pytest.fixture
def oracle(tmp_path: Path):
    child = Child(tmp_path / "child.log")
    o = Oracle(tmp_path / "world", child, tmp_path / "state")
    yield o
    o.close()
    child.close()


def replay(oracle: Oracle, *steps: Step) -> None:
    oracle.check()
    for step in steps:
        step(oracle.world)
        oracle.check()


def test_a_directory_deleted_and_recreated_then_a_header_edited_in_place(oracle) -> None:
    """hypothesis: change_dir_in_use(how='recreate'), edit_header_in_use(how='in place')."""
    replay(
        oracle,
        lambda w: w.recreate_dir("gen", "headers"),
        lambda w: w.edit_header("gen/config.h", "in place"),
    )


def test_a_directory_swapped_by_rename_then_a_header_edited_in_place(oracle) -> None:
    """hypothesis: swap_dirs(pair=('gen', 'gen.new')), edit_header_in_use(how='in place')."""
    replay(
        oracle,
        lambda w: w.swap_dirs("gen", "gen.new"),
        lambda w: w.edit_header("gen/config.h", "in place"),
    )


def test_a_symlink_on_the_include_path_repointed(oracle) -> None:
    """The issue's third case (inc/config.h -> ../shared/current/config.h, current from
    v1 to v2), written from its report; the state machine reaches it by include_path
    and change_dir_in_use(how='repoint') or repoint_symlink."""
    replay(
        oracle,
        lambda w: w.set(includes=("inc",)),
        lambda w: w.repoint("shared/current", "v2"),
    )


def test_the_cli_without_arch_after_device_0_changed_arch(oracle) -> None:
    """hypothesis: arch_of_device_0(arch='sm_80')."""
    replay(oracle, lambda w: w.set(device_arch="sm_80"))


def test_the_cli_with_arch_after_device_0_changed_arch(oracle) -> None:
    """The same with --arch named: the fast hit path may serve it (and must stay right)."""
    replay(
        oracle,
        lambda w: w.set(arch="sm_90"),
        lambda w: w.set(device_arch="sm_80"),
        lambda w: w.set(arch="sm_80"),
    )
