"""Randomized lifetime stress (issue 11, section 3): made for compute-sanitizer.

A seeded random walk over graph operations -- node add/update/delete, clone,
instantiate, whole-graph and node exec updates, stream capture in every mode,
launches -- that drops Python references and runs ``gc.collect()`` at random
points, captures included. Buffers used by definitions are usually dropped right
after use, so any owner released too early is a use of freed memory that
``SANITIZE=1 scripts/gpu-test tests/test_graph_random_stress.py`` reports. At the
end every owner must be released: each buffer's allocation is dead, no bundle and
no deferred release is left.

``CUFORGE_STRESS_SEED`` replays a seed (printed by every run), ``CUFORGE_STRESS_STEPS``
sets the walk's length (default 300).
"""

from __future__ import annotations

import gc
import os
import random

import pytest

from test_graph_common import (  # noqa: F401 - no_leftover_bundles is an autouse fixture
    cfg,
    kernels,
    no_leftover_bundles,
    released,
    setup_device,
)

pytestmark = pytest.mark.gpu
MODES = ("global", "thread_local", "relaxed")


class Walk:
    """The objects of one random walk and the operations on them."""

    def __init__(self, dev, rng: random.Random) -> None:
        from cuforge.runtime.memory import weak_handle

        self.dev = dev
        self.rng = rng
        self.k = kernels()
        self.stream = dev.create_stream()
        self.defs: list = []  # [definition, live kernel nodes]
        self.execs: list = []  # [exec, its source's kernel nodes at instantiation]
        self.buffers: list = []  # buffers still referenced by the walk
        self.watch: list = []  # weak handles of every allocation made
        self.weak = weak_handle
        # Captured work is caller-owned (the contract): one buffer lives for the walk.
        self.captured_target = dev.allocate(256)
        self.counts: dict[str, int] = {}

    # --- helpers ---------------------------------------------------------------------
    def buffer(self):
        b = self.dev.allocate(4 * self.rng.choice((1, 16, 64)))
        self.watch.append(self.weak(b))
        if self.rng.random() < 0.3:
            self.buffers.append(b)
        return b

    def drop_some(self) -> None:
        for pool in (self.buffers, self.defs, self.execs):
            if pool and self.rng.random() < 0.3:
                victim = pool.pop(self.rng.randrange(len(pool)))
                if self.rng.random() < 0.5 and hasattr(victim, "close"):
                    victim.close()
        if self.rng.random() < 0.5:
            gc.collect()

    # --- operations ------------------------------------------------------------------
    def op_new_definition(self) -> None:
        from cuforge.graph import GraphDefinition

        self.defs.append([GraphDefinition(), []])

    def op_add_node(self) -> None:
        if not self.defs:
            return self.op_new_definition()
        g, nodes = self.rng.choice(self.defs)
        b = self.buffer()
        kind = self.rng.random()
        if kind < 0.6:
            nodes.append(g.launch(cfg(), self.k["add_one"], b, 1))
        elif kind < 0.8:
            g.memset(b, self.rng.randrange(256), 4)
        else:
            g.memcpy(b, self.buffer(), 4)
        del b

    def op_update_node(self) -> None:
        live = [(g, n) for g, nodes in self.defs for n in nodes]
        if live:
            _g, node = self.rng.choice(live)
            node.update(cfg(), self.k["add_one"], self.buffer(), 1)

    def op_delete_node(self) -> None:
        live = [(nodes, n) for _g, nodes in self.defs for n in nodes]
        if live:
            nodes, node = self.rng.choice(live)
            nodes.remove(node)
            # Execs made earlier keep their own copy of the node: they may still
            # update it through the exec, which CUDA allows only while it exists in
            # the source graph -- so forget it there too.
            for _e, enodes in self.execs:
                if node in enodes:
                    enodes.remove(node)
            node.destroy()

    def op_clone(self) -> None:
        if self.defs:
            g, _nodes = self.rng.choice(self.defs)
            self.defs.append([g.clone(), []])

    def op_instantiate(self) -> None:
        if self.defs:
            g, nodes = self.rng.choice(self.defs)
            self.execs.append([g.instantiate(), list(nodes)])

    def op_exec_node_update(self) -> None:
        candidates = [(e, n) for e, nodes in self.execs for n in nodes]
        if candidates:
            e, node = self.rng.choice(candidates)
            try:
                e[node].update(cfg(), self.k["add_one"], self.buffer(), 1)
            except ValueError:  # its definition was closed: refused, nothing retained
                self.counts["refused exec node update"] = (
                    self.counts.get("refused exec node update", 0) + 1
                )

    def op_exec_whole_update(self) -> None:
        from cuforge import CUDAError

        if self.execs and self.defs:
            e, _nodes = self.rng.choice(self.execs)
            g, _gn = self.rng.choice(self.defs)
            try:
                e.update(g)  # refused unless the topologies match: nothing may change then
            except (CUDAError, ValueError):
                self.counts["refused update"] = self.counts.get("refused update", 0) + 1

    def op_launch(self) -> None:
        if self.execs:
            e, _nodes = self.rng.choice(self.execs)
            e.launch(self.stream)

    def op_capture(self) -> None:
        from cuforge import launch

        builder = self.dev.create_graph_builder()
        builder.begin_building(self.rng.choice(MODES))
        launch(builder, cfg(), self.k["add_one"], self.captured_target, 1)
        builder.callback(lambda: None)
        self.drop_some()  # references go and the collector runs during the capture
        if self.defs and self.rng.random() < 0.5:
            builder.embed(self.rng.choice(self.defs)[0])  # CUDA copies it with its owners
        builder.end_building()
        if self.rng.random() < 0.7:
            exe = builder.complete()
            exe.launch(self.stream)
            self.execs.append([exe, []])
        builder.close()

    def step(self) -> None:
        ops = (
            (self.op_new_definition, 1), (self.op_add_node, 6), (self.op_update_node, 3),
            (self.op_delete_node, 1), (self.op_clone, 1), (self.op_instantiate, 2),
            (self.op_exec_node_update, 3), (self.op_exec_whole_update, 1), (self.op_launch, 4),
            (self.op_capture, 1),
        )  # fmt: skip
        fn = self.rng.choices([f for f, _w in ops], [w for _f, w in ops])[0]
        self.counts[fn.__name__] = self.counts.get(fn.__name__, 0) + 1
        fn()
        if self.rng.random() < 0.15:
            self.drop_some()
        if self.rng.random() < 0.05:
            self.stream.sync()


def _walk(dev, seed: int, steps: int) -> tuple[list, dict]:
    walk = Walk(dev, random.Random(seed))
    for _ in range(steps):
        walk.step()
    walk.stream.sync()
    for entry in walk.execs:
        entry[0].close()
    walk.stream.sync()
    return walk.watch, walk.counts


def test_random_lifetime_walk(capsys) -> None:
    from cuforge.graph import live_bundles
    from cuforge.runtime import capture_guard

    dev = setup_device()
    seed = int(os.environ.get("CUFORGE_STRESS_SEED") or random.SystemRandom().randrange(2**32))
    steps = int(os.environ.get("CUFORGE_STRESS_STEPS", "300"))
    with capsys.disabled():
        print(f"\nrandom lifetime walk: seed {seed} (CUFORGE_STRESS_SEED={seed}), {steps} steps")
    base = live_bundles()
    watch, counts = _walk(dev, seed, steps)  # every object of the walk is unreferenced now
    assert released(lambda: live_bundles() <= base), f"owners left (seed {seed})"
    assert released(lambda: not any(w.alive for w in watch)), f"allocations left (seed {seed})"
    assert capture_guard.pending() == 0 and not capture_guard.active_captures()
    with capsys.disabled():
        print(f"random lifetime walk: seed {seed}: {len(watch)} buffers, all released; {counts}")
