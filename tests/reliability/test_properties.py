"""Property-based inputs (hypothesis): cache keys, every public cache method, the cache
URL parser and the size/duration parsers, over generated inputs.

- ``make_program_cache_key``: two inputs get one key exactly when everything the
  compiler sees is the same (code, types, the flag list, name expressions, ...), and
  it accepts exactly what ``Program(...).compile(..., cache=)`` accepts, refusing the
  rest with the same exception type.
- Every public cache method, on every backend, with generated keys, values and
  types: the answers match a dict, and the only exceptions are the documented ones.
- ``parse_cache_url`` / ``open_cache``, ``parse_size``, ``parse_duration``: a result
  that honours the contract, or the documented ValueError -- never anything else.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from _backends import FACTORIES
from _cache_workers import ARCH
from _figures import record
from cuforge.compile import CompileError, Program, ProgramOptions
from cuforge.storage import CachePathError, InMemoryProgramCache, entry_id
from cuforge.storage.units import parse_duration, parse_size
from cuforge.storage.urls import parse_cache_url
from cuforge.utils import make_program_cache_key, open_cache

EXAMPLES = int(os.environ.get("CUFORGE_HYPOTHESIS_EXAMPLES", "60"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)

# -- cache keys ------------------------------------------------------------------------------
OPTION_FIELDS = {
    "arch": st.sampled_from(["sm_80", "sm_90", "compute_90"]),
    "std": st.sampled_from([None, "c++17", "c++20"]),
    "define_macro": st.sampled_from([None, ["A"], ["A=1"], ["A=1", "B"], ["B", "A=1"], ("A", "1")]),
    "ftz": st.sampled_from([None, True, False]),
    "fma": st.sampled_from([None, True, False]),
    "debug": st.sampled_from([None, True, False]),
    "lineinfo": st.sampled_from([None, True]),
    "max_register_count": st.sampled_from([None, 32, 64]),
    "use_fast_math": st.sampled_from([None, True, False]),
    "device_code_optimize": st.sampled_from([None, True, False]),
    "diag_suppress": st.sampled_from([None, (177,), (177, 550)]),
    "name": st.sampled_from(["<default program>", "a.cu", "b.cu"]),
}
CODES = ['extern "C" __global__ void k(int* a) { *a = 1; }\n',
         'extern "C" __global__ void k(int* a) { *a = 2; }\n']  # fmt: skip


@st.composite
def key_inputs(draw: Any) -> dict[str, Any]:
    fields = {name: draw(strategy) for name, strategy in OPTION_FIELDS.items()}
    target = draw(st.sampled_from(["ptx", "cubin", "ltoir"]))
    if target == "cubin":
        fields["arch"] = fields["arch"].replace("compute", "sm")
    names = draw(st.sampled_from([(), ("k",), ("k", b"k"), (b"k", "k"), ("j",)]))
    return {"code": draw(st.sampled_from(CODES)), "fields": fields, "target": target,
            "names": names}  # fmt: skip


def _key(inp: dict[str, Any], canonical: bool) -> bytes:
    fields = dict(inp["fields"])
    if not canonical:  # the same options spelt differently: a list for a tuple of ints
        fields = {
            k: list(v) if k == "diag_suppress" and isinstance(v, tuple) else v
            for k, v in fields.items()
        }
    return make_program_cache_key(
        code=inp["code"], code_type="c++", options=ProgramOptions(**fields),
        target_type=inp["target"], name_expressions=inp["names"],
    )  # fmt: skip


def _what_the_compiler_sees(inp: dict[str, Any]) -> tuple:
    options = ProgramOptions(**inp["fields"])
    cwd = os.getcwd() if options.debug or options.lineinfo else None
    return (inp["code"], inp["target"], tuple(options.as_nvrtc_options()), options.name,
            tuple(sorted((type(n).__name__, n) for n in inp["names"])), cwd)  # fmt: skip


@SETTINGS
@given(a=key_inputs(), b=key_inputs())
def test_keys_are_equal_exactly_when_the_compiler_sees_the_same(a, b) -> None:
    assert _key(a, True) == _key(a, False)  # equal inputs, equal keys
    same = _what_the_compiler_sees(a) == _what_the_compiler_sees(b)
    assert (_key(a, True) == _key(b, True)) is same


@SETTINGS
@given(a=key_inputs(), field=st.sampled_from(sorted(OPTION_FIELDS)), data=st.data())
def test_changing_any_field_the_compiler_sees_changes_the_key(a, field, data) -> None:
    b = {**a, "fields": dict(a["fields"])}
    b["fields"][field] = data.draw(OPTION_FIELDS[field])
    if b["target"] == "cubin":
        b["fields"]["arch"] = b["fields"]["arch"].replace("compute", "sm")
    assume(_what_the_compiler_sees(a) != _what_the_compiler_sees(b))
    assert _key(a, True) != _key(b, True)


ANY_CODE = st.sampled_from(
    [CODES[0], CODES[0].encode(), bytearray(b"x"), "", "   \n", 7, None,
     ".version 8.0\n.target sm_90\n.address_size 64\n", "define void @f() { ret void }"]
)  # fmt: skip
ANY_NAMES = st.sampled_from([(), ("k",), [b"k"], ("k", 3), "k", b"k", 5, (bytearray(b"k"),)])


@settings(SETTINGS, max_examples=max(EXAMPLES, 80))
@given(
    code=ANY_CODE,
    code_type=st.sampled_from(["c++", "C++ ", "ptx", "nvvm", "cuda", 3]),
    target=st.sampled_from(["ptx", "CUBIN", "ltoir", "fatbin", None]),
    arch=st.sampled_from(["sm_90", "compute_90"]),
    lto=st.sampled_from([None, True]),
    names=ANY_NAMES,
    side_effect=st.booleans(),
)
def test_the_key_accepts_exactly_what_compile_accepts(
    code, code_type, target, arch, lto, names, side_effect
) -> None:
    fields: dict[str, Any] = {"arch": arch, "link_time_optimization": lto}
    if side_effect:
        fields["create_pch"] = "x.pch"  # a hit would skip it: refused by both with cache=
    try:
        options = ProgramOptions(**fields)
    except (TypeError, ValueError):
        return

    def key() -> str:
        make_program_cache_key(
            code=code, code_type=code_type, options=options, target_type=target,
            name_expressions=names,
        )  # fmt: skip
        return "accepted"

    def compile_it() -> str:
        with contextlib.suppress(CompileError):  # the backend ran: inputs were accepted
            Program(code, code_type, options).compile(target, names, cache=InMemoryProgramCache())
        return "accepted"

    outcomes = []
    for attempt in (key, compile_it):
        try:
            outcomes.append(attempt())
        except (TypeError, ValueError) as exc:
            outcomes.append(type(exc).__name__)
    assert outcomes[0] == outcomes[1], (outcomes, code, code_type, target, names, fields)


# -- every public cache method ---------------------------------------------------------------
KEYS = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=20),
    st.text(alphabet=st.characters(codec=None), max_size=5),  # lone surrogates included
    st.sampled_from([None, 3, 1.5, ["k"], bytearray(b"k"), memoryview(b"k"), ("k",)]),
)
VALUES = st.one_of(
    st.binary(max_size=3000),
    st.builds(bytearray, st.binary(max_size=100)),
    st.builds(memoryview, st.binary(max_size=100)),
    st.sampled_from(["text", None, 5, [b"x"]]),
)
METAS = st.one_of(st.binary(max_size=200), st.sampled_from(["meta", None, 1, bytearray(b"m")]))
IDS = st.one_of(
    st.text(max_size=70), st.sampled_from([None, 5, b"ab"]),
    st.binary(min_size=32, max_size=32).map(bytes.hex),
)  # fmt: skip
OPS = st.one_of(
    st.tuples(st.just("set"), KEYS, VALUES),
    st.tuples(st.just("set_entry"), KEYS, VALUES, METAS),
    st.tuples(st.just("get"), KEYS),
    st.tuples(st.just("getitem"), KEYS),
    st.tuples(st.just("get_entry"), KEYS),
    st.tuples(st.just("delitem"), KEYS),
    st.tuples(st.just("update"), st.lists(st.tuples(KEYS, VALUES), max_size=3)),
    st.tuples(st.just("lock"), KEYS, st.sampled_from([0.0, 0.5, None, -1.0])),
    st.tuples(st.just("check_entry"), IDS),
    st.tuples(st.just("read_entry"), IDS),
    st.tuples(st.just("remove_entry"), IDS),
    st.tuples(st.just("id_of_stored"), KEYS),
    st.tuples(st.just("len")),
    st.tuples(st.just("iter_entries")),
    st.tuples(st.just("clear")),
    st.tuples(st.just("contains"), KEYS),
)
#: What a caller may see: bad key/value/meta types (TypeError), a str key without a
#: UTF-8 form (ValueError), a miss by subscript (KeyError); nothing else.
DOCUMENTED = (TypeError, ValueError, KeyError)


def _key_bytes(key: Any) -> bytes | None:
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        try:
            return key.encode()
        except UnicodeEncodeError:
            return None
    return None


def _value_bytes(value: Any) -> bytes | None:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return None


def _apply(cache: Any, model: dict[bytes, tuple[bytes, bytes]], op: tuple) -> None:
    name, *args = op
    k = _key_bytes(args[0]) if args and name not in ("update",) else None
    try:
        if name == "set":
            cache[args[0]] = args[1]
            model[k] = (_value_bytes(args[1]), b"")  # type: ignore[index]
        elif name == "set_entry":
            cache.set_entry(args[0], args[1], args[2])
            assert isinstance(args[2], bytes)
            model[k] = (_value_bytes(args[1]), args[2])  # type: ignore[index]
        elif name == "get":
            assert cache.get(args[0]) == (model.get(k, (None,))[0] if k is not None else None)
            assert k is not None
        elif name == "getitem":
            got = cache[args[0]]
            assert k in model and got == model[k][0]
        elif name == "get_entry":
            entry = cache.get_entry(args[0])
            want = model.get(k)  # type: ignore[arg-type]
            assert (entry is None and want is None) or tuple(entry) == want
        elif name == "delitem":
            del cache[args[0]]
            assert model.pop(k, None) is not None  # type: ignore[arg-type]
        elif name == "update":
            for key, value in args[0]:
                kb, vb = _key_bytes(key), _value_bytes(value)
                cache.update([(key, value)])
                assert kb is not None and vb is not None
                model[kb] = (vb, b"")
        elif name == "lock":
            with cache.lock(args[0], timeout=args[1]) as held:
                assert isinstance(held, bool)
        elif name in ("check_entry", "read_entry", "remove_entry"):
            result = getattr(cache, name)(args[0])
            if name == "remove_entry" and result:
                for key in [key for key in model if entry_id(key) == args[0]]:
                    del model[key]
            if name == "check_entry":
                assert result is None or isinstance(result, str)
        elif name == "id_of_stored":
            if k is not None and k in model:
                assert cache.check_entry(entry_id(k)) is None
                assert tuple(cache.read_entry(entry_id(k))) == model[k]
        elif name == "len":
            assert len(cache) == len(model)
        elif name == "iter_entries":
            assert {e.id for e in cache.iter_entries()} == {entry_id(k) for k in model}
        elif name == "clear":
            cache.clear()
            model.clear()
        elif name == "contains":
            args[0] in cache  # noqa: B015 - documented to raise TypeError
            raise AssertionError("'in' is documented to raise TypeError")
    except AssertionError:
        raise
    except DOCUMENTED:
        pass


@pytest.fixture(params=sorted(FACTORIES))
def any_cache(request: pytest.FixtureRequest, tmp_path: Path):
    cache = FACTORIES[request.param](tmp_path, request)
    yield request.param, cache
    cache.close()


@SETTINGS
@given(ops=st.lists(OPS, max_size=25))
def test_every_public_method_answers_like_a_dict_or_raises_what_is_documented(any_cache, ops):
    _name, cache = any_cache
    cache.clear()
    model: dict[bytes, tuple[bytes, bytes]] = {}
    for op in ops:
        _apply(cache, model, op)
    for key, want in model.items():  # and the end state is what was stored
        assert tuple(cache.get_entry(key)) == want


def test_property_suites_ran() -> None:
    record(
        "inputs", "all", "hypothesis: keys, cache methods x every backend, URL/size/duration "
        "parsers", EXAMPLES,
        f"{EXAMPLES} examples per property (derandomized; CUFORGE_HYPOTHESIS_EXAMPLES sets it):"
        " keys equal iff the compiler sees the same; key accepts what compile accepts; "
        "only documented exceptions",
        scale="all", lost=0,
    )  # fmt: skip


# -- URLs and units --------------------------------------------------------------------------
URL_PIECES = st.lists(
    st.one_of(
        st.sampled_from(["file://", "memory://", "redis://", "rediss://", "sqlite://", "x://",
                         "./c", "?", "&", "=", ",", "%", "%2C", "%zz", "ro", "max_size",
                         "mode", "durable", "trust", "shared", "64M", "2770", "abc", " ", ""]),
        st.text(max_size=6),
    ),
    max_size=12,
).map("".join)  # fmt: skip


@SETTINGS
@given(text=st.one_of(URL_PIECES, st.text(max_size=60)))
def test_the_cache_url_parser_returns_specs_or_a_value_error(text: str) -> None:
    try:
        specs = parse_cache_url(text)
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert specs and all(spec.scheme and isinstance(spec.params, dict) for spec in specs)


@SETTINGS
@given(text=st.one_of(URL_PIECES, st.text(max_size=30)))
@example(text="?ro")  # read-only: the write is dropped, not stored
def test_open_cache_on_generated_local_urls_raises_only_documented_errors(
    text, tmp_path, monkeypatch
) -> None:
    # Generated text must not name a place outside tmp_path, nor a server: no "/" (or
    # its escape), no backslash, no redis or sqlite level; relative paths land in tmp_path.
    lowered = text.lower()
    assume(not any(bad in lowered for bad in ("/", "%2f", "%5c", "\\", "redis", "sqlite")))
    monkeypatch.chdir(tmp_path)
    for url in (f"memory://{text}", f"file://{tmp_path}/{text}", f"{tmp_path}/c{text}"):
        try:
            cache = open_cache(url, secret=None)
        except (ValueError, CachePathError):
            continue
        # ``ro`` (a read-only level) is a valid flag: such a cache drops the write.
        read_only = all(spec.read_only for spec in parse_cache_url(url))
        with contextlib.closing(cache):
            cache[b"k"] = b"v"
            assert cache.get(b"k") == (None if read_only else b"v"), url


def _exact(number: str, unit: int) -> int:
    return int(Fraction(number) * unit)


@SETTINGS
@given(
    number=st.from_regex(r"\A[0-9]{1,25}(\.[0-9]{1,10})?\Z"),
    unit=st.sampled_from(["", "k", "K", "M", "g", "T", "KiB", "KB", "kb", "MiB", "b", "B"]),
    space=st.sampled_from(["", " "]),
)
def test_sizes_are_exact_or_a_value_error(number: str, unit: str, space: str) -> None:
    factor = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(unit[:1].lower(), 1)
    want = _exact(number, factor)
    text = f"{number}{space}{unit}"
    try:
        got = parse_size(text, bare=True)  # a cache URL's: a plain number is bytes
    except ValueError as exc:
        assert want <= 0 or want > (1 << 63) - 1, (number, unit, exc)
        return
    assert got == want and 0 < got < 1 << 63
    if unit:  # the command line's and the settings files' (a unit required)
        assert parse_size(text) == got
    else:
        with pytest.raises(ValueError, match="has no unit"):
            parse_size(text)


@SETTINGS
@given(text=st.one_of(st.text(max_size=30), st.binary(max_size=10), st.integers(), st.none()))
def test_size_and_duration_parsers_never_raise_anything_else(text: Any) -> None:
    for parse, bare in itertools.product((parse_size, parse_duration), (False, True)):
        try:
            value = parse(text, bare=bare)
        except ValueError as exc:
            assert str(exc) and "\n" not in str(exc)
            continue
        assert value > 0
        if parse is parse_duration:
            assert value <= 100 * 365.25 * 86400
        else:
            assert isinstance(value, int) and value < 1 << 63


@SETTINGS
@given(
    number=st.from_regex(r"\A[0-9]{1,12}(\.[0-9]{1,6})?\Z"),
    unit=st.sampled_from(["", "ms", "s", "m", "h", "d", "w", "MS", "H"]),
)
def test_durations_scale_by_their_unit(number: str, unit: str) -> None:
    seconds = {"": 1, "ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    want = float(number) * seconds[unit.lower()]
    try:
        got = parse_duration(number + unit, bare=True)  # a cache URL's: plain is seconds
    except ValueError:
        assert want <= 0 or want > 100 * 365.25 * 86400
        return
    assert got == pytest.approx(want)
    if unit:  # the command line's and the settings files' (a unit required)
        assert parse_duration(number + unit) == got
    else:
        with pytest.raises(ValueError, match="has no unit"):
            parse_duration(number)


def test_a_model_of_arch_for_cubin_keys() -> None:
    """The generators above sample real ProgramOptions; make sure one key compiles."""
    src = CODES[0]
    options = ProgramOptions(arch=ARCH)
    key = make_program_cache_key(code=src, code_type="c++", options=options, target_type="cubin")
    assert len(key) == 32
