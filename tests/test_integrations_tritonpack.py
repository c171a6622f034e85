"""A Triton kernel's pack (``cuforge.integrations._tritonpack``): what goes in comes
out, and anything that is not exactly a pack is None (a miss), never a file."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cuforge.integrations._tritonpack import MAGIC, pack, unpack

_names = st.text(st.characters(blacklist_characters="/\0"), min_size=1, max_size=20).filter(
    lambda n: n not in (".", "..")
)


@given(st.dictionaries(_names, st.binary(max_size=300), min_size=1, max_size=8))
def test_a_pack_unpacks_to_its_files_in_order(files: dict[str, bytes]) -> None:
    items = list(files.items())
    assert unpack(pack(items)) == items


def _raw(header: object, body: bytes) -> bytes:
    return MAGIC + json.dumps(header).encode() + b"\n" + body


@pytest.mark.parametrize(
    "raw",
    [
        None,
        b"",
        b"not a pack",
        MAGIC,  # no header line
        MAGIC + b"[not json\n",
        _raw([], b""),  # no files
        _raw({"a": 1}, b"x"),
        _raw([["a.cubin", 2]], b"x"),  # shorter than it says
        _raw([["a.cubin", 1]], b"xy"),  # bytes past the last file
        _raw([["a.cubin", -1]], b""),
        _raw([["a.cubin", True]], b"x"),
        _raw([["a.cubin", 1.0]], b"x"),
        _raw([["../a.cubin", 1]], b"x"),
        _raw([["d/a.cubin", 1]], b"x"),
        _raw([["..", 1]], b"x"),
        _raw([["", 1]], b"x"),
        _raw([[7, 1]], b"x"),
        _raw([["a\u0000b", 1]], b"x"),
        _raw([["a", 1], ["a", 1]], b"xy"),  # a name twice
        b"cuforge-triton-pack 2\n" + _raw([["a", 1]], b"x")[len(MAGIC) :],  # another version
    ],
)
def test_what_is_not_exactly_a_pack_is_none(raw: bytes | None) -> None:
    assert unpack(raw) is None


@pytest.mark.parametrize(
    "files", [[("a/b", b"")], [("a\0b", b"")], [("..", b"")], [("", b"")], [("a", b""), ("a", b"")]]
)
def test_pack_refuses_names_triton_cannot_be_given_a_path_for(
    files: list[tuple[str, bytes]],
) -> None:
    with pytest.raises(ValueError, match="not a kernel's file names"):
        pack(files)
