"""ObjectCode: constructors from bytes and paths, attributes, get_kernel mapping."""

from __future__ import annotations

import pytest

from cuforge.compile import ObjectCode, Program, ProgramOptions
from cuforge.compile.object_code import CODE_TYPES

ARCH = "sm_90"
SRC = 'extern "C" __global__ void k(int* p) { *p = 1; }'


@pytest.fixture(scope="module")
def cubin() -> bytes:
    return Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin").code


@pytest.mark.parametrize("kind", CODE_TYPES)
def test_from_bytes_keeps_bytes(kind):
    obj = getattr(ObjectCode, f"from_{kind}")(bytearray(b"\x01\x02payload"))
    assert obj.code == b"\x01\x02payload" and type(obj.code) is bytes
    assert obj.code_type == kind
    assert obj.name == "" and obj.symbol_mapping == {}


def test_from_path_reads_at_construction(tmp_path, cubin):
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    from_path = ObjectCode.from_cubin(path)
    from_str = ObjectCode.from_cubin(str(path), name="custom", symbol_mapping={"x": "k"})
    path.unlink()  # the objects hold the bytes, not the path
    assert from_path.code == cubin == from_str.code
    assert from_path.name == "k.cubin"
    assert from_str.name == "custom" and from_str.symbol_mapping == {"x": "k"}
    with pytest.raises(FileNotFoundError):
        ObjectCode.from_cubin(path)


def test_from_ptx_drops_trailing_nul(tmp_path):
    path = tmp_path / "k.ptx"
    path.write_bytes(b".version 9.0\n\0")
    assert ObjectCode.from_ptx(path).code == b".version 9.0\n"


def test_constructor_errors():
    with pytest.raises(TypeError, match="bytes or a path"):
        ObjectCode.from_cubin(1234)
    with pytest.raises(ValueError, match="empty"):
        ObjectCode.from_ltoir(b"")
    with pytest.raises(ValueError, match="code_type"):
        ObjectCode(b"x", "sass")
    with pytest.raises(TypeError, match="symbol_mapping"):
        ObjectCode(b"x", "cubin", symbol_mapping={"a": b"mangled"})


def test_repr_and_mapping_copy():
    obj = ObjectCode(b"abc", "ptx", name="n", symbol_mapping={"a": "_Z1av"})
    assert "ptx" in repr(obj) and "3 bytes" in repr(obj)
    obj.symbol_mapping["b"] = "x"
    assert obj.symbol_mapping == {"a": "_Z1av"}


def test_get_kernel_rejects_bad_name_type_before_loading():
    with pytest.raises(TypeError, match="kernel name"):
        ObjectCode(b"abc", "cubin").get_kernel(3)


def test_weak_referenceable_so_loaded_libraries_can_be_released():
    import gc
    import weakref

    obj = ObjectCode(b"abc", "cubin")
    ref = weakref.ref(obj)
    del obj
    gc.collect()
    assert ref() is None
