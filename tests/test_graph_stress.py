"""10,000 build/instantiate/launch/destroy cycles: no growth in live owners or RSS."""

from __future__ import annotations

import gc
import resource

import pytest

from test_graph_common import (
    cfg,
    kernels,
    read_ints,
    released,
    setup_device,
    write_ints,
)


@pytest.fixture
def dev():
    return setup_device()


pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def _cycle(device, stream, k, counter) -> None:
    from cuforge.graph import GraphDefinition

    g = GraphDefinition()
    tmp = device.allocate(64)
    g.memset(tmp, 0, 64).launch(cfg(), k["add_one"], counter, 1).callback(lambda: None)
    exe = g.instantiate()
    g.close()
    exe.launch(stream)
    exe.close()


def test_ten_thousand_cycles_no_growth(dev) -> None:
    from cuforge.graph import live_bundles

    k = kernels()
    stream = dev.create_stream()
    counter = dev.allocate(4)
    write_ints(counter, [0])
    start = live_bundles()
    for _ in range(500):  # warm-up: caches, pools, allocator arenas
        _cycle(dev, stream, k, counter)
    stream.sync()
    assert released(lambda: live_bundles() <= start)
    gc.collect()
    rss0, bundles0 = _rss_kib(), live_bundles()
    peak = 0
    for i in range(10_000):
        _cycle(dev, stream, k, counter)
        if i % 500 == 499:
            stream.sync()
            peak = max(peak, live_bundles())
    stream.sync()
    assert read_ints(counter, 1)[0] == 10_500
    assert released(lambda: live_bundles() == bundles0)
    gc.collect()
    rss1 = _rss_kib()
    print(
        f"\n10k cycles: live bundles {bundles0} -> {live_bundles()} (peak at sync {peak}), "
        f"RSS {rss0} KiB -> {rss1} KiB ({rss1 - rss0:+d} KiB)"
    )
    assert rss1 - rss0 < 16 * 1024, "RSS grew by more than 16 MiB over 10,000 cycles"
