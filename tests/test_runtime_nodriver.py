"""cuforge.runtime on a machine without a CUDA driver (CI), plus the parts that need
no device at all: LaunchConfig validation, argument packing, Buffer ownership."""

from __future__ import annotations

import ctypes
import gc
import importlib
import pkgutil
import struct
import weakref

import numpy as np
import pytest


def _driver_present() -> bool:
    from cuda.bindings import driver

    try:
        return driver.cuInit(0)[0] == driver.CUresult.CUDA_SUCCESS
    except Exception:
        return False


needs_no_driver = pytest.mark.skipif(
    _driver_present(), reason="checks the no-driver behaviour; a CUDA driver is present"
)


def test_import_cuforge_is_lazy():
    import cuforge

    assert "Device" in dir(cuforge)
    # dir() lists the public names, not the implementation's (a new user saw these)
    names = dir(cuforge)
    assert not {"TYPE_CHECKING", "annotations", "_lazy", "_log", "_EXPORTS"} & set(names)
    assert set(cuforge.__all__) <= set(names) and "__version__" in names
    assert cuforge.Device.__name__ == "Device"
    assert cuforge.LaunchConfig is importlib.import_module("cuforge.runtime.launch").LaunchConfig
    assert issubclass(cuforge.CUDAError, RuntimeError)


def test_compile_layer_imports():
    import cuforge.compile as compile_pkg

    for mod in pkgutil.iter_modules(compile_pkg.__path__):
        importlib.import_module(f"cuforge.compile.{mod.name}")
    import cuforge

    for name, module in cuforge._EXPORTS.items():
        if module.startswith("cuforge.compile."):
            assert getattr(cuforge, name) is not None


class StandInObjectCode:
    code = b"\x7fELF"
    code_type = "cubin"
    name = "x"
    symbol_mapping: dict = {}


@needs_no_driver
@pytest.mark.parametrize(
    "entry",
    [
        "Device()",
        "Device(0)",
        "Device(0).sync()",
        "DeviceMemoryResource()",
        "PinnedMemoryResource()",
        "Stream.from_handle(0)",
        "Stream.legacy_default()",
        "launch(None, LaunchConfig(1, 1), None)",
        "load_kernel(StandInObjectCode(), 'k')",
        "device_count()",
    ],
)
def test_runtime_entry_points_raise_clear_cudaerror(entry):
    import cuforge.runtime as rt
    from cuforge.runtime import CUDAError
    from cuforge.runtime.init import device_count

    env = {name: getattr(rt, name) for name in rt.__all__}
    env.update(StandInObjectCode=StandInObjectCode, device_count=device_count)
    for _ in range(2):  # the second attempt must fail the same clear way
        with pytest.raises(CUDAError, match="no CUDA driver found") as info:
            eval(entry, env)
        assert info.value.name == "CUDA_ERROR_NO_DRIVER"
        assert "compile and cache layers work without it" in str(info.value)


def test_check_helper_and_error_text():
    from cuda.bindings import driver

    from cuforge.runtime.errors import CUDAError, check

    assert check((driver.CUresult.CUDA_SUCCESS,)) is None
    assert check((driver.CUresult.CUDA_SUCCESS, 5)) == 5
    assert check((driver.CUresult.CUDA_SUCCESS, 5, 6)) == (5, 6)
    with pytest.raises(CUDAError, match="doing x: CUDA_ERROR_INVALID_VALUE") as info:
        check((driver.CUresult.CUDA_ERROR_INVALID_VALUE,), "doing x")
    assert info.value.result == driver.CUresult.CUDA_ERROR_INVALID_VALUE
    assert info.value.name == "CUDA_ERROR_INVALID_VALUE"


# --- LaunchConfig --------------------------------------------------------------------
def test_launch_config_normalises_to_3_tuples():
    from cuforge import LaunchConfig

    c = LaunchConfig(grid=8, block=(16, 4))
    assert c.grid == (8, 1, 1) and c.block == (16, 4, 1)
    assert c.shmem_size == 0 and c.cluster is None and c.cooperative_launch is False
    assert c.grid_in_blocks == (8, 1, 1)
    c2 = LaunchConfig((2, 3, 4), [1, 2, 3], shmem_size=1024, cluster=(2, 1))
    assert c2.cluster == (2, 1, 1) and c2.grid_in_blocks == (4, 3, 4)
    assert LaunchConfig(np.int64(4), 32).grid == (4, 1, 1)
    assert LaunchConfig(8, (16, 4)) == c and hash(LaunchConfig(8, (16, 4))) == hash(c)
    with pytest.raises(AttributeError, match="immutable"):
        c.grid = (1, 1, 1)


def test_programmatic_launch_config_takes_the_attribute_path_and_compares_by_flag():
    from cuforge import LaunchConfig

    plain = LaunchConfig(4, 32)
    pdl = LaunchConfig(4, 32, programmatic_stream_serialization=True)
    assert plain.programmatic_stream_serialization is False
    assert pdl.programmatic_stream_serialization is True
    assert pdl != plain and hash(pdl) != hash(plain)
    assert pdl == LaunchConfig((4, 1, 1), (32, 1, 1), programmatic_stream_serialization=True)
    assert "programmatic_stream_serialization=True" in repr(pdl)
    assert "programmatic" not in repr(plain)
    # The C launcher takes plain dimensions only: PDL needs cuLaunchKernelEx's attribute.
    assert plain._plain is not None and pdl._plain is None


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"grid": 0, "block": 1}, ValueError, "grid dimensions must be >= 1"),
        ({"grid": (1, 1, 1, 1), "block": 1}, ValueError, "1 to 3 dimensions"),
        ({"grid": (), "block": 1}, ValueError, "1 to 3 dimensions"),
        ({"grid": 1.5, "block": 1}, TypeError, "grid must hold ints"),
        ({"grid": True, "block": 1}, TypeError, "grid must hold ints"),
        ({"grid": 1, "block": (64, 32)}, ValueError, "more than 1024 threads"),
        ({"grid": 1, "block": -1}, ValueError, "block dimensions"),
        ({"grid": 1, "block": 1, "shmem_size": -1}, ValueError, "shmem_size"),
        ({"grid": 1, "block": 1, "shmem_size": 1.0}, TypeError, "shmem_size"),
        ({"grid": 1, "block": 1, "cluster": 0}, ValueError, "cluster"),
        ({"grid": 1, "block": 1, "cooperative_launch": 1}, TypeError, "cooperative"),
        (
            {"grid": 1, "block": 1, "programmatic_stream_serialization": 1},
            TypeError,
            "programmatic_stream_serialization must be a bool",
        ),
    ],
)
def test_launch_config_validation(kwargs, exc, match):
    from cuforge import LaunchConfig

    with pytest.raises(exc, match=match):
        LaunchConfig(**kwargs)


# --- argument packing ----------------------------------------------------------------
def _values(packed):
    n = len(packed.sizes)
    ptrs = struct.unpack(f"<{n}Q", ctypes.string_at(packed.params, 8 * n))
    return [ctypes.string_at(p, s) for p, s in zip(ptrs, packed.sizes, strict=True)]


def test_pack_args_scalars():
    from cuforge.runtime.args import pack_args

    class Pair(ctypes.Structure):
        _fields_ = (("a", ctypes.c_int32), ("b", ctypes.c_float))

    args = (
        -3,
        True,
        2.5,
        np.float32(1.5),
        np.int16(-2),
        np.uint64(2**63 + 1),
        np.complex64(1 + 2j),
        ctypes.c_int8(-1),
        ctypes.c_double(0.25),
        Pair(7, 0.5),
        2**64 - 1,
    )
    p = pack_args(args)
    assert p.owners == ()
    assert _values(p) == [
        struct.pack("<q", -3),
        b"\x01",
        struct.pack("<d", 2.5),
        struct.pack("<f", 1.5),
        struct.pack("<h", -2),
        struct.pack("<Q", 2**63 + 1),
        np.complex64(1 + 2j).tobytes(),
        b"\xff",
        struct.pack("<d", 0.25),
        struct.pack("<if", 7, 0.5),
        b"\xff" * 8,
    ]
    assert pack_args(()).params == 0 and pack_args(()).owners == ()


def test_pack_args_values_are_snapshots():
    from cuforge.runtime.args import pack_args

    c = ctypes.c_int32(1)
    p = pack_args((c,))
    c.value = 2
    assert _values(p) == [struct.pack("<i", 1)]


def test_pack_args_type_errors_name_the_position():
    from cuforge.runtime.args import pack_args

    with pytest.raises(TypeError, match=r"argument 2: cannot pass builtins\.str"):
        pack_args((1, 2.0, "three"))
    with pytest.raises(TypeError, match=r"argument 0: cannot pass builtins\.NoneType"):
        pack_args((None,))
    with pytest.raises(TypeError, match=r"argument 1: .*not CUDA"):
        pack_args((1, np.zeros(3)))  # host memory through __dlpack__
    with pytest.raises(OverflowError, match=r"argument 1: int .* 64 bits"):
        pack_args((1, 2**64))
    with pytest.raises(OverflowError, match="argument 0"):
        pack_args((-(2**63) - 1,))


class CudaArrayLike:
    """A minimal producer of the __cuda_array_interface__ protocol."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (4,), "typestr": "<f4", "data": (self.ptr, False), "version": 3}


def test_pack_args_buffers_and_arrays_record_owners():
    from cuforge.runtime import Buffer
    from cuforge.runtime.args import pack_args

    buf = Buffer.from_handle(0x7F00_0000_1000, 64)
    arr = CudaArrayLike(0x7F00_0000_2000)
    p = pack_args((buf, arr, 3))
    assert _values(p)[:2] == [struct.pack("<Q", buf.handle), struct.pack("<Q", arr.ptr)]
    assert p.owners == (buf.allocation, arr)
    buf.close()
    with pytest.raises(ValueError, match="argument 0: Buffer is closed"):
        pack_args((buf, arr, 3))


# --- Buffer ownership without a device -----------------------------------------------
class Owner:
    pass


def test_foreign_buffer_keeps_owner_and_allocation_outlives_close():
    from cuforge.runtime import Buffer
    from cuforge.runtime.memory import weak_handle

    owner = Owner()
    owner_ref = weakref.ref(owner)
    buf = Buffer.from_handle(0x1000, 128, owner=owner)
    del owner
    gc.collect()
    assert owner_ref() is not None
    assert buf.handle == 0x1000 and buf.size == 128 and not buf.is_closed
    assert buf.__cuda_array_interface__["data"] == (0x1000, False)
    alloc = buf.allocation
    watch = weak_handle(buf)
    buf.close()
    buf.close()  # no-op
    assert buf.is_closed
    for attr in ("handle", "allocation", "memory_resource"):
        with pytest.raises(ValueError, match="closed"):
            getattr(buf, attr)
    gc.collect()
    assert watch.alive and owner_ref() is not None
    del alloc
    gc.collect()
    assert not watch.alive and owner_ref() is None


def test_buffer_cannot_be_constructed_or_pickled():
    import pickle

    from cuforge.runtime import Buffer

    with pytest.raises(TypeError):
        Buffer()
    with pytest.raises(TypeError):
        pickle.dumps(Buffer.from_handle(0x1000, 8))
    with pytest.raises(ValueError):
        Buffer.from_handle(0x1000, -1)


class HostResource:
    """A MemoryResource over ordinary host memory (ctypes), recording frees."""

    def __new__(cls):
        from cuforge.runtime import MemoryResource

        class _Host(MemoryResource):
            def __init__(self) -> None:
                self.blocks: dict[int, ctypes.Array] = {}
                self.freed: list[int] = []

            def allocate(self, size, stream=None):
                from cuforge.runtime import Buffer

                block = (ctypes.c_char * size)()
                self.blocks[ctypes.addressof(block)] = block
                return Buffer.from_handle(ctypes.addressof(block), size, mr=self)

            def deallocate(self, ptr, size, stream=None):
                self.freed.append(ptr)
                del self.blocks[ptr]

            is_device_accessible = property(lambda self: False)
            is_host_accessible = property(lambda self: True)
            device_id = property(lambda self: 0)

        return _Host()


def test_user_resource_frees_once_when_last_claim_goes():
    mr = HostResource()
    buf = mr.allocate(32)
    alloc = buf.allocation
    buf.close()
    assert mr.freed == []
    del alloc
    gc.collect()
    assert len(mr.freed) == 1


def test_dlpack_capsule_unconsumed_releases_its_claim():
    from cuforge.runtime.memory import weak_handle

    mr = HostResource()
    buf = mr.allocate(16)
    assert buf.__dlpack_device__() == (3, 0)  # kDLCUDAHost
    watch = weak_handle(buf)
    capsule = buf.__dlpack__()
    buf.close()
    gc.collect()
    assert watch.alive and mr.freed == []  # the capsule holds the allocation
    del capsule
    gc.collect()
    assert not watch.alive and len(mr.freed) == 1
    with pytest.raises(BufferError):
        mr.allocate(8).__dlpack__(copy=True)


def test_driver_values_written_out_in_the_runtime_match_the_bindings():
    """The runtime names a few driver enum values as numbers (so importing it loads no
    driver bindings); each must equal what cuda.bindings says."""
    from cuda.bindings import driver

    device, errors, event, launch, module, stream = (
        importlib.import_module(f"cuforge.runtime.{name}")
        for name in ("device", "errors", "event", "launch", "module", "stream")
    )

    result = driver.CUresult
    written = {
        (errors, "_SUCCESS"): result.CUDA_SUCCESS,
        (launch, "_SUCCESS"): result.CUDA_SUCCESS,
        (launch, "_INVALID_CONTEXT"): result.CUDA_ERROR_INVALID_CONTEXT,
        (event, "_NOT_READY"): result.CUDA_ERROR_NOT_READY,
        (event, "_DISABLE_TIMING"): driver.CUevent_flags.CU_EVENT_DISABLE_TIMING,
        (event, "_BLOCKING_SYNC"): driver.CUevent_flags.CU_EVENT_BLOCKING_SYNC,
        (device, "_ALREADY_ENABLED"): result.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        (module, "_INVALID_VALUE"): result.CUDA_ERROR_INVALID_VALUE,
        (stream, "_LEGACY"): int(driver.CU_STREAM_LEGACY),
        (stream, "_PER_THREAD"): int(driver.CU_STREAM_PER_THREAD),
        (stream, "_NON_BLOCKING"): driver.CUstream_flags.CU_STREAM_NON_BLOCKING,
        (stream, "_DEFAULT_FLAGS"): driver.CUstream_flags.CU_STREAM_DEFAULT,
    }
    for (mod, name), value in written.items():
        assert getattr(mod, name) == int(value), (mod.__name__, name)
        # and compares equal both ways to what the driver returns (an int enum)
        assert value == getattr(mod, name) and (value != getattr(mod, name)) is False
