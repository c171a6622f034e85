"""Types of the C module ``cuforge._native._launch`` (launch.c): kernel launches and
kernel nodes through the driver's entry points. Pointers and handles are ints (0 for
NULL); results are CUresult ints, -1 / -2 where launch.c says (not packable here /
argument types differ from ``types``)."""

# (gx, gy, gz, bx, by, bz, shmem)
_Dims = tuple[int, int, int, int, int, int, int]

def call1(entry: int, a0: int, /) -> int: ...
def launch(
    entry: int,
    function: int,
    gx: int,
    gy: int,
    gz: int,
    bx: int,
    by: int,
    bz: int,
    shmem: int,
    stream: int,
    params: int,
    /,
) -> int: ...
def launch_args(
    entry: int,
    function: int,
    dims: _Dims,
    stream: int,
    codes: bytes,
    types: tuple[type, ...] | None,
    args: tuple[object, ...],
    /,
) -> int: ...

# (CUresult, node)
def add_kernel_node(
    entry: int, graph: int, dep: int, kernel: int, ctx: int, dims: _Dims, params: int, /
) -> tuple[int, int]: ...

# (CUresult, node, the Buffer arguments' allocations), or -1 / -2
def add_kernel_node_args(
    entry: int,
    graph: int,
    dep: int,
    kernel: int,
    ctx: int,
    dims: _Dims,
    codes: bytes,
    types: tuple[type, ...] | None,
    args: tuple[object, ...],
    /,
) -> tuple[int, int, tuple[object, ...]] | int: ...
def graph_launch(
    launch_entry: int, record_entry: int, exec: int, stream: int, event: int, /
) -> int: ...
