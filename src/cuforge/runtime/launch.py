"""``LaunchConfig`` and ``launch``: run a Kernel on a Stream.

Plain configurations (no cluster, not cooperative) launch through
``cuforge._native._launch``, which calls the driver's ``cuLaunchKernel`` entry point
with plain ints; the others, or a build without the C helper, use
``cuLaunchKernelEx`` through cuda-bindings. Both give the same result and errors.

Guarantees:
- ``LaunchConfig`` is immutable and validated at construction: ``grid``, ``block`` and
  ``cluster`` become 3-tuples of positive ints. As in cuda.core, when ``cluster`` is
  set ``grid`` counts clusters; ``grid_in_blocks`` is the block grid CUDA sees.
- ``programmatic_stream_serialization=True`` (programmatic dependent launch, sm_90+)
  lets the kernel start before the previous kernel of its stream has finished: from
  the moment every block of that kernel triggered (``griddepcontrol.launch_dependents``
  / ``cudaTriggerProgrammaticLaunchCompletion``) or exited. The kernel must wait for
  the previous one's results itself (``griddepcontrol.wait`` /
  ``cudaGridDependencySynchronize``). Stream capture turns it into a programmatic
  graph edge; graph kernel nodes make the same edge (see ``cuforge.graph``).
- ``launch`` checks the argument count and each argument's packed size against the
  kernel image before the first launch of each argument-type signature, so a wrong
  count or a too-narrow value raises instead of reading garbage on the device.
- Parameters are copied by the driver at launch: the arguments may change or die
  right after ``launch`` returns (memory they point to must of course stay valid
  until the kernel has run).
- Thread safe: a LaunchConfig, Kernel and Stream may be shared between threads; a
  thread with no current context launches in the stream's context.
Failure modes: no driver -> CUDAError; bad config -> ValueError/TypeError at
construction; wrong argument count/type -> TypeError; driver failures -> CUDAError.
"""

from __future__ import annotations

import operator
import struct
import threading

from cuforge.runtime import init
from cuforge.runtime.args import PackedArgs, _Plan, pack_args, plan_for
from cuforge.runtime.errors import error_for
from cuforge.runtime.init import driver_entry as driver_entry
from cuforge.runtime.module import Kernel
from cuforge.runtime.stream import Stream

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from typing import Any

    from cuda.bindings import driver
else:  # imported on first use: a script that only compiles never loads the driver
    from cuforge._cuda import bindings_driver as driver


if TYPE_CHECKING:
    from collections.abc import Callable

    from cuforge._typing import IsStreamT

# CUresult values (CUresult compares as an int), written out so that importing this
# module loads no driver bindings; tests/test_runtime_nodriver.py checks them.
_SUCCESS = 0  # CUDA_SUCCESS
_INVALID_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT
_MAX_CACHED_STREAMS = 64

Dim3 = tuple[int, int, int]
# (grid x, y, z, block x, y, z, shared memory bytes): what the C launcher takes
Dims7 = tuple[int, int, int, int, int, int, int]


def _dim3(value: object, what: str) -> Dim3:
    items: list[Any] = list(value) if isinstance(value, (tuple, list)) else [value]
    if not 1 <= len(items) <= 3:
        raise ValueError(f"{what} must have 1 to 3 dimensions, got {len(items)}")
    dims = []
    for v in items:
        if isinstance(v, bool):
            raise TypeError(f"{what} must hold ints, got {v!r}")
        try:
            d = operator.index(v)
        except TypeError:
            raise TypeError(f"{what} must hold ints, got {type(v).__name__}") from None
        if d < 1:
            raise ValueError(f"{what} dimensions must be >= 1, got {tuple(items)}")
        dims.append(d)
    dims += [1] * (3 - len(dims))
    return (dims[0], dims[1], dims[2])


class LaunchConfig:
    """How to launch: ``LaunchConfig(grid, block, shmem_size=0, cluster=None,
    cooperative_launch=False, programmatic_stream_serialization=False)``; ints or
    1-3 tuples for the dimensions."""

    __slots__ = (
        "_lock",
        "_native",
        "_plain",
        "block",
        "cluster",
        "cooperative_launch",
        "grid",
        "grid_in_blocks",
        "programmatic_stream_serialization",
        "shmem_size",
    )
    _lock: threading.Lock
    _native: dict[int, driver.CUlaunchConfig]
    _plain: Dims7 | None
    block: Dim3
    cluster: Dim3 | None
    cooperative_launch: bool
    grid: Dim3
    grid_in_blocks: Dim3
    programmatic_stream_serialization: bool
    shmem_size: int

    def __init__(
        self,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        shmem_size: int = 0,
        cluster: int | tuple[int, ...] | None = None,
        cooperative_launch: bool = False,
        programmatic_stream_serialization: bool = False,
    ) -> None:
        g = _dim3(grid, "grid")
        b = _dim3(block, "block")
        if b[0] * b[1] * b[2] > 1024:
            raise ValueError(f"block {b} has more than 1024 threads")
        if isinstance(shmem_size, bool) or not isinstance(shmem_size, int):
            raise TypeError(f"shmem_size must be an int, not {type(shmem_size).__name__}")
        if shmem_size < 0:
            raise ValueError(f"shmem_size must be >= 0, got {shmem_size}")
        c = None if cluster is None else _dim3(cluster, "cluster")
        if not isinstance(cooperative_launch, bool):
            raise TypeError("cooperative_launch must be a bool")
        pdl = programmatic_stream_serialization
        if not isinstance(pdl, bool):
            raise TypeError("programmatic_stream_serialization must be a bool")
        blocks = g if c is None else (g[0] * c[0], g[1] * c[1], g[2] * c[2])
        init = object.__setattr__
        init(self, "grid", g)
        init(self, "block", b)
        init(self, "shmem_size", shmem_size)
        init(self, "cluster", c)
        init(self, "cooperative_launch", cooperative_launch)
        init(self, "programmatic_stream_serialization", pdl)
        init(self, "grid_in_blocks", blocks)
        init(self, "_native", {})
        # What the C launcher takes; None where launch attributes are needed.
        attrs = c is not None or cooperative_launch or pdl
        plain: Dims7 | None = None if attrs else (*blocks, *b, shmem_size)
        init(self, "_plain", plain)
        init(self, "_lock", threading.Lock())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("LaunchConfig is immutable; make a new one")

    def __repr__(self) -> str:
        extra = f", cluster={self.cluster}" if self.cluster else ""
        extra += ", cooperative_launch=True" if self.cooperative_launch else ""
        if self.programmatic_stream_serialization:
            extra += ", programmatic_stream_serialization=True"
        return (
            f"LaunchConfig(grid={self.grid}, block={self.block}, "
            f"shmem_size={self.shmem_size}{extra})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LaunchConfig) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[object, ...]:
        return (
            self.grid,
            self.block,
            self.shmem_size,
            self.cluster,
            self.cooperative_launch,
            self.programmatic_stream_serialization,
        )

    def _native_for(self, stream: Stream) -> driver.CUlaunchConfig:
        """The driver struct for ``stream``, built once per stream handle."""
        cached: driver.CUlaunchConfig | None = self._native.get(stream._handle_int)
        if cached is not None:
            return cached
        cfg = driver.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = self.grid_in_blocks
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.block
        cfg.sharedMemBytes = self.shmem_size
        cfg.hStream = stream.handle
        attrs = []
        if self.cluster is not None:
            a = driver.CUlaunchAttribute()
            a.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = self.cluster
            attrs.append(a)
        if self.cooperative_launch:
            a = driver.CUlaunchAttribute()
            a.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            a.value.cooperative = 1
            attrs.append(a)
        if self.programmatic_stream_serialization:
            a = driver.CUlaunchAttribute()
            a.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            a.value.programmaticStreamSerializationAllowed = 1
            attrs.append(a)
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        with self._lock:
            if len(self._native) >= _MAX_CACHED_STREAMS:
                self._native.clear()
            self._native[stream._handle_int] = cfg
        return cfg


def validate_args(kernel: Kernel, packed: PackedArgs, nargs: int) -> None:
    """Raise TypeError unless ``packed`` (from ``nargs`` arguments) fits ``kernel``'s
    parameters: same count, and no value narrower than its parameter (only an int may
    be wider: its low bytes are used). Cached per kernel and argument-type signature;
    the graph layer can call it before building kernel nodes."""
    if packed.plan not in kernel._checked:
        validate_plan(kernel, packed.plan, nargs)


def validate_plan(kernel: Kernel, plan: _Plan | None, nargs: int) -> None:
    params = kernel.param_sizes
    if nargs != len(params):
        raise TypeError(f"kernel {kernel.name} takes {len(params)} argument(s), got {nargs}")
    if plan is not None:
        for i, (have, need) in enumerate(zip(plan.sizes, params, strict=True)):
            if have == need:
                continue
            # intptr_t into a narrower integer parameter: the low bytes are the value.
            code = plan.codes[i]
            if code in ("q", "Q") and need < have:
                continue
            hint = " (a Python float packs as double: pass numpy.float32)" if code == "d" else ""
            raise TypeError(
                f"argument {i}: packs {have} byte(s) but kernel {kernel.name} parameter {i} "
                f"is {need} byte(s){hint}"
            )
    kernel._checked.add(plan)


_entry = -1  # cuLaunchKernel's address; 0 when unavailable, -1 until looked up


def _unresolved_launch(*args: int) -> int:  # replaced by the C function once resolved
    raise RuntimeError("C launcher not resolved")


_c_launch: Callable[..., int] = _unresolved_launch
# cuforge._native._launch.launch_args once resolved
_c_launch_args: (
    Callable[[int, int, Dims7, int, bytes, tuple[type, ...] | None, tuple[object, ...]], int] | None
) = None


def _resolve_entry() -> int:
    """The driver's cuLaunchKernel address for the C launcher, or 0 (use the bindings)."""
    global _entry, _c_launch, _c_launch_args
    try:
        from cuforge._native import _launch
    except ImportError:  # no C helpers built: the bindings path still works
        _entry = 0
        return 0
    entry = driver_entry(b"cuLaunchKernel")
    if entry:
        _c_launch = _launch.launch
        _c_launch_args = _launch.launch_args
    _entry = entry
    return entry


def launch(stream: IsStreamT, config: LaunchConfig, kernel: Kernel, *args: object) -> None:
    """Launch ``kernel`` with ``args`` on ``stream`` (a Stream or ``__cuda_stream__``
    object) as described by ``config``. Returns once queued (asynchronous)."""
    if not init._done:
        init.ensure_initialized()
    if type(stream) is not Stream:
        stream = Stream.from_foreign(stream)
    if stream._handle is None:
        raise ValueError("cannot launch on a closed stream")
    if type(config) is not LaunchConfig:
        raise TypeError(f"config must be a LaunchConfig, not {type(config).__name__}")
    if type(kernel) is not Kernel:
        raise TypeError(f"kernel must be a Kernel, not {type(kernel).__name__}")
    last = kernel._last
    plain = config._plain
    if last is not None and plain is not None and _c_launch_args is not None:
        # The argument types are those last validated for this kernel (C checks):
        # pack and launch in one call. Anything else takes the general path.
        code = _c_launch_args(
            _entry, kernel._function_int, plain, stream._handle_int, last[0], last[1], args
        )
        if code == 0:
            return
    _launch(stream, config, kernel, args)


def _launch(stream: Stream, config: LaunchConfig, kernel: Kernel, args: tuple[object, ...]) -> None:
    """The general path: plans, validates, packs and launches (C or bindings)."""
    plain = config._plain
    if plain is not None and _entry < 0:
        _resolve_entry()
    keep: Any = None  # the parameter storage: must stay alive until the launch call
    if args:
        plan = plan_for(args)
        if plan not in kernel._checked:
            validate_plan(kernel, plan, len(args))
        codes = plan.ccodes
        if codes is not None and plain is not None and _c_launch_args is not None:
            kernel._last = (codes, plan.types)
            code = _c_launch_args(
                _entry, kernel._function_int, plain, stream._handle_int, codes, None, args
            )
            if code == 0:
                return
        try:
            params, keep = plan.raw(args)
        except struct.error:  # u64 bit patterns or overflow: the general path sorts it
            keep = pack_args(args)
            params = keep.params
    else:
        if None not in kernel._checked:
            validate_plan(kernel, None, 0)
        if _c_launch_args is not None:
            kernel._last = (b"", ())
        params = None
    if plain is not None and _entry:
        code = _c_launch(_entry, kernel._function_int, *plain, stream._handle_int, params or 0)
        if code == 0:
            return
        err = driver.CUresult(code)
        if err == _INVALID_CONTEXT:
            stream.device.set_current()
            code = _c_launch(_entry, kernel._function_int, *plain, stream._handle_int, params or 0)
            err = driver.CUresult(code)
        if err != _SUCCESS:
            raise error_for(err, f"launch {kernel.name}")
        return
    native = config._native.get(stream._handle_int) or config._native_for(stream)
    (err,) = driver.cuLaunchKernelEx(native, kernel._as_function, params, 0)
    if err != _SUCCESS:
        if err == _INVALID_CONTEXT:
            # A thread without a current context launching on a context-less stream
            # handle (legacy/per-thread default): adopt the stream's device and retry.
            stream.device.set_current()
            (err,) = driver.cuLaunchKernelEx(native, kernel._as_function, params, 0)
        if err != _SUCCESS:
            raise error_for(err, f"launch {kernel.name}")
