"""GraphDefinition / Graph / GraphBuilder behaviour: structure, conditionals, capture."""

from __future__ import annotations

import pytest

from test_graph_common import (
    cfg,
    kernels,
    read_ints,
    setup_device,
    write_ints,
)


@pytest.fixture
def dev():
    return setup_device()


pytestmark = pytest.mark.gpu


def test_structure_nodes_edges_pred_succ_join(dev, tmp_path) -> None:
    from cuforge.graph import EmptyNode, GraphDefinition, KernelNode, MemsetNode

    k = kernels()
    buf = dev.allocate(16)
    g = GraphDefinition()
    a = g.memset(buf, 0, 16)
    b = a.launch(cfg(), k["add_one"], buf, 1)
    c = a.launch(cfg(), k["add_one"], buf, 1)
    j = g.join(b, c)
    assert isinstance(a, MemsetNode) and isinstance(b, KernelNode) and isinstance(j, EmptyNode)
    assert set(g.nodes()) == {a, b, c, j}
    assert set(a.succ) == {b, c} and set(j.pred) == {b, c}
    assert {(x, y) for x, y in g.edges()} == {(a, b), (a, c), (b, j), (c, j)}
    e = j.empty()
    assert e.pred == (j,)
    e.destroy()
    assert len(g.nodes()) == 4
    dot = tmp_path / "g.dot"
    g.debug_dot_print(str(dot))
    assert "digraph" in dot.read_text()
    g.close()
    with pytest.raises(ValueError):
        g.nodes()
    with pytest.raises(ValueError):
        a.launch(cfg(), k["noop"])


def test_events_alloc_free_enable_disable(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    out = dev.allocate(4)
    write_ints(out, [0])
    ev = dev.create_event()
    g = GraphDefinition()
    alloc = g.allocate(64)
    assert alloc.dptr != 0
    inc = alloc.launch(cfg(), k["add_one"], out, 1)
    rec = inc.record(ev)
    rec.wait(ev).deallocate(alloc)
    exe = g.instantiate()
    exe.launch(stream)
    stream.sync()
    assert read_ints(out, 1)[0] == 1
    view = exe[inc]
    view.disable()
    assert view.enabled is False
    exe.launch(stream)
    stream.sync()
    assert read_ints(out, 1)[0] == 1
    view.enable()
    exe.launch(stream)
    stream.sync()
    assert read_ints(out, 1)[0] == 2
    exe.close()


def test_whole_graph_update_and_upload(dev) -> None:
    from cuforge.graph import GraphCompleteOptions, GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    a, b = dev.allocate(4), dev.allocate(4)
    write_ints(a, [0])
    write_ints(b, [0])
    g1 = GraphDefinition()
    g1.launch(cfg(), k["add_one"], a, 1)
    exe = g1.instantiate(GraphCompleteOptions(upload_stream=stream))
    g2 = GraphDefinition()
    g2.launch(cfg(), k["add_one"], b, 1)
    exe.update(g2)
    g1.close()
    g2.close()
    exe.launch(stream)
    stream.sync()
    assert read_ints(a, 1)[0] == 0 and read_ints(b, 1)[0] == 1
    exe.close()


def test_conditional_while_loop_counts_on_gpu(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    counter = dev.allocate(4)
    write_ints(counter, [0])
    g = GraphDefinition()
    cond = g.create_condition(default_value=1)
    loop = g.while_loop(cond)
    loop.body.launch(cfg(), k["count_while"], counter, int(cond), 10)
    exe = g.instantiate()
    exe.launch(stream)
    stream.sync()
    assert read_ints(counter, 1)[0] == 10
    exe.close()
    g.close()


def test_conditional_if_else_explicit(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    then_buf, else_buf = dev.allocate(4), dev.allocate(4)
    write_ints(then_buf, [0])
    write_ints(else_buf, [0])
    g = GraphDefinition()
    cond = g.create_condition()
    setter = g.launch(cfg(), k["set_cond"], int(cond), 0)
    node = setter.if_else(cond)
    then, other = node.branches
    then.launch(cfg(), k["add_one"], then_buf, 1)
    other.launch(cfg(), k["add_one"], else_buf, 1)
    exe = g.instantiate()
    exe.launch(stream)
    stream.sync()
    assert read_ints(then_buf, 1)[0] == 0 and read_ints(else_buf, 1)[0] == 1
    exe.close()


def test_builder_split_join(dev) -> None:
    from cuforge import launch
    from cuforge.graph import GraphBuilder

    k = kernels()
    stream = dev.create_stream()
    bufs = [dev.allocate(4) for _ in range(3)]
    for b in bufs:
        write_ints(b, [0])
    gb = dev.create_graph_builder()
    assert isinstance(gb, GraphBuilder)
    gb.begin_building()
    forks = gb.split(3)
    assert forks[0] is gb and len(forks) == 3
    for f, b in zip(forks, bufs, strict=True):
        launch(f, cfg(), k["add_one"], b, 1)
        launch(f, cfg(), k["add_one"], b, 1)
    joined = GraphBuilder.join(*forks)
    assert joined is gb
    launch(gb, cfg(), k["add_one"], bufs[0], 1)
    gb.end_building()
    g = gb.graph_definition
    assert len(g.nodes()) >= 7
    exe = gb.complete()
    exe.launch(stream)
    stream.sync()
    assert [int(read_ints(b, 1)[0]) for b in bufs] == [3, 2, 2]
    with pytest.raises(RuntimeError):
        _ = forks[1].graph_definition
    gb.close()
    assert len(g.nodes()) >= 7  # a view taken earlier stays valid
    with pytest.raises(RuntimeError):
        _ = gb.graph_definition
    exe.close()


def test_builder_graph_definition_state_rules(dev) -> None:
    stream = dev.create_stream()
    gb = stream.create_graph_builder()
    with pytest.raises(RuntimeError):
        _ = gb.graph_definition  # primary before begin_building
    gb.begin_building()
    with pytest.raises(RuntimeError):
        _ = gb.graph_definition  # during capture
    cond = gb.create_conditional_handle(default_value=0)
    body = gb.if_cond(cond)
    assert body.graph_definition.nodes() == ()  # body: valid before begin_building
    body.begin_building()
    with pytest.raises(RuntimeError):
        _ = body.graph_definition
    body.end_building()
    gb.end_building()
    assert gb.graph_definition.nodes()
    with pytest.raises(RuntimeError):
        gb.begin_building()
    gb.close()


def test_builder_while_loop_then_callback(dev) -> None:
    from cuforge import launch

    k = kernels()
    stream = dev.create_stream()
    counter = dev.allocate(4)
    write_ints(counter, [0])
    hits: list[int] = []
    gb = stream.create_graph_builder()
    gb.begin_building()
    cond = gb.create_conditional_handle(default_value=1)
    body = gb.while_loop(cond)
    body.begin_building()
    launch(body, cfg(), k["count_while"], counter, int(cond), 5)
    body.end_building()
    gb.callback(lambda: hits.append(1))  # host nodes may not sit in conditional bodies
    gb.end_building()
    exe = gb.complete()
    exe.launch(stream)
    stream.sync()
    assert read_ints(counter, 1)[0] == 5 and hits == [1]
    exe.close()
    gb.close()


def test_builder_embed_and_errors(dev) -> None:
    from cuforge.graph import GraphDefinition

    stream = dev.create_stream()
    buf = dev.allocate(16)
    child = GraphDefinition()
    child.memset(buf, 9, 16)
    gb = stream.create_graph_builder()
    with pytest.raises(RuntimeError):
        gb.callback(lambda: None)  # not capturing
    with pytest.raises(ValueError):
        gb.begin_building("bogus")
    gb.begin_building()
    gb.embed(child)
    with pytest.raises(ValueError):
        gb.callback(lambda: None, user_data=b"x")  # user_data is for ctypes pointers
    gb.end_building()
    exe = gb.complete()
    exe.launch(stream)
    stream.sync()
    assert (read_ints(buf, 4) == 0x09090909).all()
    exe.close()
    gb.close()
    gb.close()  # idempotent
