"""Kernel argument packing: Python values -> the ``void**`` that ``cuLaunchKernelEx``
and kernel nodes take.

Mapping: Buffer -> its pointer (owner: its allocation); bool -> bool (1 byte);
an object with ``__kernel_arg_u64__()`` (a graph Condition) -> that 64-bit value;
int -> intptr_t (8 bytes; a kernel taking a narrower integer reads the low bytes);
float -> double; numpy scalars -> their dtype's bytes; ctypes scalars and structures
-> their bytes; objects with ``__cuda_array_interface__`` or ``__dlpack__`` (torch
tensors, CuPy arrays) -> their device pointer (owner: the object).

Guarantees: ``PackedArgs.params`` (an int: the address of the pointer array) stays
valid as long as the PackedArgs object lives; values are copied at packing time.
``owners`` lists what must outlive any use of the parameters. Packing is planned once
per tuple of argument types, then each call is a single ``struct.pack_into``.
Failure modes: an unsupported type -> TypeError naming the position (0-based) and
type; a closed Buffer -> ValueError naming the position; an int beyond 64 bits ->
OverflowError naming the position. Thread safe (plans are immutable once cached).
"""

from __future__ import annotations

import struct
import sys

from cuforge.runtime.memory import Buffer

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

_POINTER = 8


class PackedArgs:
    """Packed kernel parameters: pass ``params`` as ``kernelParams``; keep ``owners``
    (and this object) alive while the parameters can be used."""

    __slots__ = ("_storage", "owners", "params", "plan")

    def __init__(self, params: int, owners: tuple[Any, ...], storage: Any, plan: Any) -> None:
        self.params = params
        self.owners = owners
        self._storage = storage
        self.plan = plan

    @property
    def sizes(self) -> tuple[int, ...]:
        """Bytes packed for each argument."""
        return self.plan.sizes if self.plan is not None else ()

    def __len__(self) -> int:
        return len(self.sizes)


# A handler says how one argument type packs: (struct format, getter expression
# template or None for the value itself, owner expression template or None).
_Handler = tuple[str, "str | None", "str | None"]


def _closed(i: int) -> int:
    raise ValueError(f"argument {i}: Buffer is closed")


def _cai_ptr(obj: Any, i: int) -> int:
    try:
        return int(obj.__cuda_array_interface__["data"][0])
    except Exception as exc:
        if hasattr(obj, "__dlpack__"):
            return _dlpack_ptr(obj, i)
        raise TypeError(
            f"argument {i}: {type(obj).__name__} has no usable __cuda_array_interface__ ({exc})"
        ) from exc


def _dlpack_ptr(obj: Any, i: int) -> int:
    from cuforge.runtime.interop import dlpack_pointer

    try:
        return dlpack_pointer(obj)
    except Exception as exc:
        raise TypeError(
            f"argument {i}: {type(obj).__name__} is not CUDA-accessible memory ({exc})"
        ) from exc


_NUMPY_CODES = {
    ("b", 1): "?",
    ("i", 1): "b",
    ("i", 2): "h",
    ("i", 4): "i",
    ("i", 8): "q",
    ("u", 1): "B",
    ("u", 2): "H",
    ("u", 4): "I",
    ("u", 8): "Q",
    ("f", 2): "e",
    ("f", 4): "f",
    ("f", 8): "d",
}


def _handler_for(tp: type) -> _Handler | None:
    if issubclass(tp, Buffer):
        return ("Q", "({a}._ptr if {a}._alloc is not None else _closed({i}))", "{a}._alloc")
    if issubclass(tp, bool):
        return ("?", None, None)
    if issubclass(tp, int):
        return ("q", None, None)
    if issubclass(tp, float):
        return ("d", None, None)
    np = sys.modules.get("numpy")
    if np is not None and issubclass(tp, np.generic):
        dt = np.dtype(tp)
        # struct packs numpy numbers natively (via __index__/__float__): cheaper than
        # tobytes(); other dtypes (complex, datetime, ...) go as raw bytes.
        code = _NUMPY_CODES.get((dt.kind, dt.itemsize))
        if code is not None:
            return (code, None, None)
        return (f"{dt.itemsize}s", "{a}.tobytes()", None)
    # ctypes' scalar, Structure and Union types are _ctypes' (ctypes re-exports them):
    # none of them exists before _ctypes is imported, so this imports nothing
    c = sys.modules.get("_ctypes")
    if c is not None and issubclass(tp, (c._SimpleCData, c.Structure, c.Union)):
        return (f"{c.sizeof(tp)}s", "bytes({a})", None)
    if hasattr(tp, "__kernel_arg_u64__"):  # e.g. cuforge.graph.Condition
        return ("Q", "{a}.__kernel_arg_u64__()", None)
    if hasattr(tp, "__cuda_array_interface__"):
        return ("Q", "_cai_ptr({a}, {i})", "{a}")
    if hasattr(tp, "__dlpack__"):
        return ("Q", "_dlpack_ptr({a}, {i})", "{a}")
    return None


_C_CODES = frozenset("?bBhHiIqQfd")


class _Plan:
    """How to pack one tuple of argument types (compiled to a small function)."""

    __slots__ = (
        "__weakref__", "ccodes", "codes", "fill", "fmt", "nbytes", "pack", "raw", "sizes",
        "types",
    )  # fmt: skip

    def __init__(self, types: Sequence[type]) -> None:
        n = len(types)
        self.types = tuple(types)
        handlers = []
        for i, tp in enumerate(types):
            h = _handler_for(tp)
            if h is None:
                raise TypeError(
                    f"argument {i}: cannot pass {tp.__module__}.{tp.__qualname__} to a kernel "
                    "(use Buffer, int, float, bool, a numpy or ctypes scalar, or an array with "
                    "__cuda_array_interface__ / __dlpack__)"
                )
            handlers.append(h)
        fmt = ["<", f"{n}Q"]
        offset = n * _POINTER
        offsets, sizes, values, owners = [], [], [], []
        for i, (code, getter, owner) in enumerate(handlers):
            size = struct.calcsize("<" + code)
            offsets.append(offset)
            sizes.append(size)
            fmt.append(code)
            pad = -size % _POINTER
            if pad:
                fmt.append(f"{pad}x")
            offset += size + pad
            a = f"a{i}"
            values.append(getter.format(a=a, i=i) if getter else a)
            if owner:
                owners.append(owner.format(a=a, i=i))
        self.fmt = "".join(fmt)
        self.codes = tuple(h[0] for h in handlers)
        # What the C packer (cuforge._native._launch) takes: one byte per argument, or
        # None when some argument needs Python (arrays, bytes-like values, half floats).
        cc: list[str] = []
        for tp, (code, getter, _owner) in zip(types, handlers, strict=True):
            if issubclass(tp, Buffer):
                cc.append("P")
            elif getter is None and code in _C_CODES:
                cc.append(code)
            else:
                break
        self.ccodes: bytes | None = "".join(cc).encode() if len(cc) == len(types) else None
        self.sizes = tuple(sizes)
        names = ", ".join(f"a{i}" for i in range(n))
        ptrs = ", ".join(f"b + {o}" for o in offsets)
        owner_tuple = "(" + "".join(f"{o}, " for o in owners) + ")"
        # Generated once per signature: one unpack, one allocation, one pack_into.
        src = (
            f"def pack(args):\n"
            f"    {names}, = args\n"
            f"    buf = _new()\n"
            f"    b = _addr(buf)\n"
            f"    _pack_into(buf, 0, {ptrs}, {', '.join(values)})\n"
            f"    return _Packed(b, {owner_tuple}, buf, plan)\n"
            # launch's variant: no owners or PackedArgs (the driver copies at launch).
            f"def raw(args):\n"
            f"    {names}, = args\n"
            f"    buf = _new()\n"
            f"    b = _addr(buf)\n"
            f"    _pack_into(buf, 0, {ptrs}, {', '.join(values)})\n"
            f"    return b, buf\n"
            # Graph nodes' variant: into the caller's memory at address b (the driver
            # copies it during the add call); returns only what must be kept alive.
            f"def fill(args, buf, b):\n"
            f"    {names}, = args\n"
            f"    _pack_into(buf, 0, {ptrs}, {', '.join(values)})\n"
            f"    return {owner_tuple}\n"
        )
        import ctypes  # here, once per plan: a script that never launches never pays for it

        env: dict[str, Any] = {
            "_new": ctypes.c_char * offset,
            "_addr": ctypes.addressof,
            "_pack_into": struct.Struct(self.fmt).pack_into,
            "_Packed": PackedArgs,
            "_closed": _closed,
            "_cai_ptr": _cai_ptr,
            "_dlpack_ptr": _dlpack_ptr,
            "plan": self,
        }
        exec(compile(src, f"<cuforge pack_args {self.fmt}>", "exec"), env)
        self.pack: Callable[[Sequence[Any]], PackedArgs] = env["pack"]
        self.raw: Callable[[Sequence[Any]], tuple[int, Any]] = env["raw"]
        self.fill: Callable[[Sequence[Any], Any, int], tuple[Any, ...]] = env["fill"]
        self.nbytes = offset


_plans: dict[tuple[type, ...], _Plan] = {}
_EMPTY = PackedArgs(0, (), None, None)
_MAX_PLANS = 4096


def _overflow(args: Sequence[Any], exc: Exception) -> Exception:
    for i, a in enumerate(args):
        if isinstance(a, int) and not isinstance(a, bool) and not -(2**63) <= a < 2**64:
            return OverflowError(f"argument {i}: int {a} does not fit in 64 bits")
    return exc


def _is_u64(a: Any) -> bool:
    return isinstance(a, int) and not isinstance(a, bool) and 2**63 <= a < 2**64


def plan_for(args: Sequence[Any]) -> _Plan:
    """The (cached) packing plan for the types of non-empty ``args``."""
    key = tuple(map(type, args))
    plan = _plans.get(key)
    if plan is None:
        plan = _Plan(key)
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = plan
    return plan


def pack_args(args: Sequence[Any]) -> PackedArgs:
    """Pack ``args`` for a kernel launch or kernel node (see the module docstring)."""
    if not args:
        return _EMPTY
    plan = plan_for(args)
    try:
        return plan.pack(args)
    except struct.error as exc:
        # Unsigned 64-bit ints (e.g. raw pointers) are valid intptr_t bit patterns.
        if any(_is_u64(a) for a in args):
            fixed = [a - 2**64 if _is_u64(a) else a for a in args]
            try:
                return plan.pack(fixed)
            except struct.error:
                pass
        raise _overflow(args, exc) from None
