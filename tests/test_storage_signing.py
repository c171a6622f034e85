"""Signed entries on every backend: accept, reject (tampered or another secret),
unsigned, listing and checking through the signature, and a planted cubin."""

from __future__ import annotations

from pathlib import Path

import pytest

from _backends import FACTORIES, PLAIN
from _cache_workers import ARCH, SRC
from cuforge.compile import Program, ProgramOptions
from cuforge.storage import InMemoryProgramCache, SignedProgramCache, TieredProgramCache, entry_id
from cuforge.storage.entry import CacheEntry, key_digest
from cuforge.utils import make_program_cache_key, open_cache

SECRET = b"s" * 32
OTHER = b"o" * 32


@pytest.fixture(params=PLAIN)
def backend(request: pytest.FixtureRequest, tmp_path: Path):
    """A plain backend: what another host (or an attacker) writes to directly."""
    c = FACTORIES[request.param](tmp_path, request)
    yield c
    c.close()


def test_signed_entries_round_trip_and_carry_their_metadata(backend) -> None:
    signed = SignedProgramCache(backend, SECRET)
    signed.set_entry(b"k", b"payload", b"meta")
    signed[b"plain"] = b"no meta"
    assert signed.get_entry(b"k") == CacheEntry(b"payload", b"meta")
    assert signed.get(b"plain") == b"no meta"
    s = signed.stats()  # the inner cache's counters
    assert (s.hits, s.misses, s.signature_failures) == (2, 0, 0)
    assert backend.get(b"k") == b"payload"  # the payload stays raw in the backend
    assert backend.get_entry(b"k").meta.endswith(b"meta")  # signature in front
    assert signed.check_entry(entry_id(b"k")) is None
    assert signed.read_entry(entry_id(b"k")) == CacheEntry(b"payload", b"meta")
    listed = {e.id: e.meta for e in signed.iter_entries()}
    assert listed == {entry_id(b"k"): b"meta", entry_id(b"plain"): b""}


def _assert_rejected(signed: SignedProgramCache, key: bytes, why: str) -> None:
    before = signed.stats()
    assert signed.get_entry(key) is None
    assert signed.get(key) is None
    after = signed.stats()
    assert after.signature_failures - before.signature_failures == 2
    assert after.misses - before.misses == 2
    assert after.hits == before.hits  # a rejected entry is never a hit
    assert why in signed.check_entry(entry_id(key))
    assert signed.read_entry(entry_id(key)) is None


def test_unsigned_entries_are_misses(backend) -> None:
    backend.set_entry(b"k", b"planted", b"meta")  # written without the secret
    _assert_rejected(SignedProgramCache(backend, SECRET), b"k", "unsigned")


def test_entries_signed_with_another_secret_are_misses(backend) -> None:
    SignedProgramCache(backend, OTHER).set_entry(b"k", b"payload", b"meta")
    _assert_rejected(SignedProgramCache(backend, SECRET), b"k", "does not verify")


@pytest.mark.parametrize("part", ["payload", "metadata", "other key"])
def test_tampered_entries_are_misses(backend, part: str) -> None:
    signed = SignedProgramCache(backend, SECRET)
    signed.set_entry(b"k", b"payload", b"meta")
    stored = backend.get_entry(b"k")
    if part == "payload":  # a valid envelope with another payload
        backend.set_entry(b"k", b"evil payload", stored.meta)
    elif part == "metadata":
        backend.set_entry(b"k", stored.data, stored.meta[:-4] + b"evil")
    else:  # a genuine signed entry copied under another key
        signed.set_entry(b"other", b"evil payload", b"meta")
        theirs = backend.get_entry(b"other")
        backend.set_entry(b"k", theirs.data, theirs.meta)
    _assert_rejected(signed, b"k", "does not verify")


def test_a_planted_cubin_is_never_loaded(backend, monkeypatch) -> None:
    """Someone who can write the shared backend stores a forged cubin under the real
    key; a signed compile ignores it, compiles, and overwrites it with a signed entry."""
    options = ProgramOptions(arch=ARCH)
    key = make_program_cache_key(code=SRC, code_type="c++", options=options, target_type="cubin")
    backend.set_entry(key, b"\x7fELF forged cubin", b"")
    signed = SignedProgramCache(backend, SECRET)
    obj = Program(SRC, "c++", options).compile("cubin", cache=signed)
    genuine = Program(SRC, "c++", options).compile("cubin").code
    assert obj.code == genuine
    assert signed.stats().signature_failures >= 1
    assert signed.get(key) == genuine  # replaced by a signed entry
    hit = Program(SRC, "c++", options).compile("cubin", cache=signed)
    assert hit.code == genuine


def test_signing_through_a_tier_rejects_what_a_level_holds(tmp_path: Path) -> None:
    from cuforge.storage import FileStreamProgramCache, InMemoryProgramCache

    shared = FileStreamProgramCache(tmp_path)
    shared.set_entry(b"k", b"planted", b"")
    with open_cache(f"memory://,file://{tmp_path}", secret=SECRET) as tier:
        assert isinstance(tier, TieredProgramCache)
        assert isinstance(tier.levels[0], InMemoryProgramCache)  # in-process: not signed
        assert isinstance(tier.levels[1], SignedProgramCache)
        assert tier.get(b"k") is None and tier.stats().signature_failures == 1
        tier[b"k"] = b"genuine"
    with open_cache(f"file://{tmp_path}", secret=SECRET) as again:
        assert again.get(b"k") == b"genuine"


@pytest.mark.parametrize("name", ["memory", "filestream", "sqlite", "redis"])
def test_zero_stats_resets_the_signature_failures_with_the_inner_counters(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    inner = FACTORIES[name](tmp_path, request)
    with SignedProgramCache(inner, SECRET) as signed:
        inner.set_entry(b"k", b"planted", b"")  # unsigned
        assert signed.get(b"k") is None and signed.get(b"absent") is None
        totals = signed.total_stats()
        assert (totals.signature_failures, totals.misses) == (1, 2)
        signed.zero_stats()  # the inner cache's: shared totals where it keeps them
        totals = signed.total_stats()
        assert (totals.signature_failures, totals.misses, totals.stores) == (0, 0, 0)
        assert signed.get(b"k") is None
        assert signed.total_stats().signature_failures == 1  # counted once


def test_open_cache_takes_the_secret_from_the_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CUFORGE_CACHE_SECRET", "e" * 32)
    with open_cache(str(tmp_path)) as c:
        assert isinstance(c, SignedProgramCache)
        c[b"k"] = b"v"
    with open_cache(str(tmp_path), secret=None) as c:  # explicitly unsigned
        assert not isinstance(c, SignedProgramCache)
        assert c.get_entry(b"k").meta[:4] == b"CFSG"
    with open_cache(str(tmp_path), secret=OTHER) as c:
        assert c.get(b"k") is None


@pytest.mark.parametrize(
    ("secret", "error", "match"),
    [
        (b"short", ValueError, "at least 16 bytes"),
        ("", ValueError, "at least 16 bytes"),
        (12345, TypeError, "bytes or str"),
    ],
)
def test_bad_secrets_are_refused(secret, error, match) -> None:
    from cuforge.storage import InMemoryProgramCache

    with pytest.raises(error, match=match):
        SignedProgramCache(InMemoryProgramCache(), secret)


def test_a_short_secret_in_the_environment_names_the_variable(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CUFORGE_CACHE_SECRET", "hunter2")
    with pytest.raises(ValueError, match=r"\$CUFORGE_CACHE_SECRET must be at least 16 bytes"):
        open_cache(str(tmp_path))


def test_one_compile_over_an_unsigned_entry_counts_one_signature_failure(backend) -> None:
    """The compile's look-again under the fill's lock rejected the unsigned entry a
    second time: one request counted ``signature_failures`` 2 (and one miss)."""
    options = ProgramOptions(arch=ARCH, name="one.cu")
    Program(SRC, "c++", options).compile("cubin", cache=backend)  # stored unsigned
    signed = SignedProgramCache(backend, SECRET)
    before = signed.stats()
    Program(SRC, "c++", options).compile("cubin", cache=signed)
    after = signed.stats()
    assert after.signature_failures - before.signature_failures == 1
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 0)


def test_each_request_counts_its_rejection_once(backend) -> None:
    """The look-again protocol (``compile.cache._pipeline``): a request's first lookup
    says a miss is not its answer (``count_miss=False``), the look-again under the
    key's lock counts it -- one rejection per request. Every other lookup is one of
    its own; an uncounted one (``count=False``: ``explain``) counts nothing."""
    backend.set_entry(b"k", b"planted", b"")
    backend.set_entry(b"j", b"planted", b"")
    signed = SignedProgramCache(backend, SECRET)

    def failures() -> int:
        return signed.stats().signature_failures

    assert signed.get_entry(b"k", count_miss=False) is None and failures() == 0
    with signed.lock(b"k"):
        assert signed.get_entry(b"k") is None and failures() == 1  # the look-again
        assert signed.get_entry(b"k") is None and failures() == 2  # a lookup of its own
    assert signed.get_entry(b"k") is None and failures() == 3  # the next request
    with signed.lock(b"j"):  # taking a lock counts nothing by itself
        assert signed.get_entry(b"j") is None and failures() == 4
    assert signed.get_entry(b"k", count=False) is None and failures() == 4
    assert signed.stats().misses == 4
    # a tier asks its levels as it is asked
    tier = TieredProgramCache(InMemoryProgramCache(), signed)
    assert tier.get_entry(b"k", count_miss=False) is None and failures() == 4
    with tier.lock(b"k"):
        assert tier.get_entry(b"k") is None and failures() == 5
    assert tier.get_entry(b"k") is None and failures() == 6


def test_a_tier_back_fills_signed_levels_under_one_secret_with_one_hmac_per_entry(
    tmp_path: Path, monkeypatch
) -> None:
    """A batched read through signed levels under one secret verifies each entry where
    it is found and stores it in the faster level with the signature it carries
    (``tiered._sealed``): one HMAC per entry instead of two, the stored metadata byte
    for byte what signing it there gives. Under another secret the faster level
    signs it itself; an entry that does not verify is stored nowhere."""
    from cuforge.storage import FileStreamProgramCache

    items = [(b"k%d" % i, b"payload %d" % i, b"meta %d" % i) for i in range(5)]
    far = SignedProgramCache(FileStreamProgramCache(tmp_path / "far"), SECRET)
    far.set_entries(items)
    FileStreamProgramCache(tmp_path / "far").set_entry(b"planted", b"evil", b"")
    signs = []
    real = SignedProgramCache._sign
    monkeypatch.setattr(
        SignedProgramCache, "_sign", lambda self, *a: signs.append(a[0]) or real(self, *a)
    )
    near = SignedProgramCache(FileStreamProgramCache(tmp_path / "near"), SECRET)
    tier = TieredProgramCache(near, far)
    got = tier.get_entries([k for k, _, _ in items] + [b"planted"])
    assert got == [CacheEntry(d, m) for _, d, m in items] + [None]
    assert len(signs) == len(items)  # verified once each, where found
    assert tier.stats().signature_failures == 1
    for k, d, m in items:  # what the near level holds is what it would have signed
        stored = near.inner.get_entry(k)
        assert stored == CacheEntry(d, b"CFSG\x01" + near._sign(key_digest(k), d, m) + m)
    assert near.get_entries([k for k, _, _ in items]) == got[:-1]
    assert near.inner.get_entry(b"planted") is None
    # another secret: the near level signs each entry itself, and it verifies there
    other = SignedProgramCache(FileStreamProgramCache(tmp_path / "other"), OTHER)
    signs.clear()
    assert TieredProgramCache(other, far).get_entries([k for k, _, _ in items]) == got[:-1]
    assert len(signs) == 2 * len(items)
    assert other.get_entries([k for k, _, _ in items]) == got[:-1]
