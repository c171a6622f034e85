"""Signed entries: an HMAC-SHA256 layer any backend can wear.

A cache shared between hosts or users (a Redis server, a group directory) lets
anyone who can write to it plant an entry -- a cubin another host will then load
and run. :class:`SignedProgramCache` closes that: every entry it stores carries an
HMAC-SHA256, under a secret only the fleet knows, over the key's digest, the
metadata and the payload; every entry it reads must carry a valid one. An entry
that is unsigned, forged, tampered with, or signed under another secret is a miss
(counted in ``signature_failures``), never a hit.

The signature rides in the entry's metadata, so it works on every backend and the
payload stays the raw binary::

    stored meta = b"CFSG" | version (1 byte, = 1) | HMAC-SHA256 (32 bytes) | caller's meta
    HMAC input  = b"cuforge-sig-1\\0" | key digest (32 bytes) | u64 LE len(meta) | meta | payload

The key digest (blake2b-256 of the key, the entry's id) stands for the key, so an
entry can also be checked by id (``check_entry``). Signing does not hide entries:
payloads are readable by anyone who can read the backend.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from time import monotonic
from typing import Any

from ._values import coerce_key, coerce_value
from .base import (
    DEFAULT_LOCK_TIMEOUT,
    CacheKey,
    CacheValue,
    EntryCache,
    ProgramCacheResource,
    check_meta,
    lookup_of,
)
from .entry import CacheEntry, EntryInfo, key_digest
from .handle import DriverCache
from .outcome import STORED_OUTCOME, StoreOutcome
from .stats import CacheStats

__all__ = ["MIN_SECRET_BYTES", "SignedProgramCache", "is_signed", "secret_bytes"]

_MAGIC = b"CFSG"
_VERSION = 1
_HEAD = len(_MAGIC) + 1
_MAC_SIZE = 32
_ENVELOPE = _HEAD + _MAC_SIZE
_DOMAIN = b"cuforge-sig-1\0"
_LEN = struct.Struct("<Q")
#: Shorter secrets are refused: 32 random bytes (``openssl rand -hex 32``) is the advice.
MIN_SECRET_BYTES = 16


def is_signed(meta: bytes | None) -> bool:
    """Whether ``meta`` (an entry's stored metadata, as a listing without the secret
    shows it) carries a signature envelope: the entry was stored signed. Says nothing
    about whether the signature is good -- only the secret can."""
    return meta is not None and len(meta) >= _ENVELOPE and meta[:4] == _MAGIC


def secret_bytes(secret: bytes | str, source: str = "secret") -> bytes:
    """``secret`` as bytes (a str is UTF-8); ValueError/TypeError naming ``source``."""
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError(f"{source} must be bytes or str, got {type(secret).__name__}")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{source} must be at least {MIN_SECRET_BYTES} bytes (got {len(secret)}); "
            "use e.g. `openssl rand -hex 32`"
        )
    return bytes(secret)


class SignedProgramCache(EntryCache):
    """``inner`` with every entry signed on store and verified on read.

    Statistics are the inner cache's: a lookup whose entry fails verification is
    counted as a miss and a ``signature_failure`` there (so a shared backend's fleet
    totals include them), once per request (see :meth:`get_entry`). Rejected entries
    are left in place -- the next fill overwrites them with a signed one -- and
    ``check_entry`` names the problem.
    ``lock``, deletion, ``len``, ``clear`` and ``total_stats`` are the inner
    cache's. Other public attributes (``path``, ``max_size_bytes``...) read through.
    """

    def __init__(self, inner: ProgramCacheResource, secret: bytes | str) -> None:
        # ProgramCacheResource.__init__ is not called: the counters are the inner
        # cache's (see _stats) and lock() is delegated.
        if not isinstance(inner, ProgramCacheResource):
            raise TypeError(f"inner must be a ProgramCacheResource, got {type(inner).__name__}")
        self._inner = inner
        key = secret_bytes(secret)
        self._mac = hmac.new(key, _DOMAIN, hashlib.sha256)
        # Names the secret without revealing it: equal for two handles under one secret.
        self._signer = hmac.new(key, b"cuforge-signer-id", hashlib.sha256).digest()

    @property
    def inner(self) -> ProgramCacheResource:
        """The wrapped backend."""
        return self._inner

    @property
    # The base class's attribute, read-only here: the wrapper's counters are its inner
    # cache's (counted there, through ``_tally``).
    def _stats(self) -> CacheStats:  # type: ignore[override]
        return self._inner._stats

    def _begin_request(self) -> None:
        self._inner._begin_request()

    def _tally_answer(self, key: bytes, entry: CacheEntry | None) -> None:
        self._inner._tally_answer(key, entry)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    # -- the signature ------------------------------------------------------------------
    def _sign(self, kd: bytes, data: bytes, meta: bytes) -> bytes:
        mac = self._mac.copy()
        mac.update(kd)
        mac.update(_LEN.pack(len(meta)))
        mac.update(meta)
        mac.update(data)
        return mac.digest()

    def _verify(self, kd: bytes, entry: CacheEntry) -> CacheEntry | str:
        stored = entry.meta
        if len(stored) < _ENVELOPE or stored[:4] != _MAGIC:
            return "unsigned entry (written without the secret)"
        if stored[4] != _VERSION:
            return f"unknown signature version {stored[4]}"
        meta = stored[_ENVELOPE:]
        if not hmac.compare_digest(stored[_HEAD:_ENVELOPE], self._sign(kd, entry.data, meta)):
            return "signature does not verify (tampered, or signed with another secret)"
        return CacheEntry(entry.data, meta)

    # -- mapping and entries ------------------------------------------------------------
    def get_entry(
        self, key: CacheKey, *, count: bool = True, count_miss: bool | None = None
    ) -> CacheEntry | None:
        """The inner cache's entry if its signature verifies; counted on the inner cache
        as one hit or miss (as ``count`` and ``count_miss`` say), a rejected one as a
        miss and a ``signature_failure`` -- once per request: where its miss is
        counted (a request's first lookup, ``count_miss=False``, leaves both to its
        look-again)."""
        k = coerce_key(key)
        entry = lookup_of(self._inner, k, False)
        result = None if entry is None else self._verify(key_digest(k), entry)
        found = result if type(result) is CacheEntry else None
        missed = count if count_miss is None else count_miss
        counted = count if found is not None else missed
        self._inner._tally(found, counted, rejected=entry is not None and found is None)
        return found

    def get_entries(self, keys: Iterable[CacheKey]) -> list[CacheEntry | None]:
        """``get_entry`` of each key: the inner cache's batched read, each entry verified
        and counted as ``get_entry`` does."""
        return [None if got is None else got[0] for got in self.get_entries_sealed(keys)]

    def get_entries_sealed(self, keys: Iterable[CacheKey]) -> list[tuple[CacheEntry, bytes] | None]:
        """:meth:`get_entries` (the same checks and counts), each verified entry with
        its metadata as stored -- signature envelope first -- which
        :meth:`set_entries_sealed` of a handle under the same secret stores as it is:
        a tier's back-fill then signs nothing again (the signature is over the key,
        the metadata and the payload: signing them again gives the same bytes)."""
        ks = [coerce_key(key) for key in keys]
        inner = self._inner
        out: list[tuple[CacheEntry, bytes] | None] = []
        for k, entry in zip(ks, self._entries_of(ks), strict=True):
            if entry is None:
                inner._tally(None)
                out.append(None)
                continue
            result = self._verify(key_digest(k), entry)
            found = result if type(result) is CacheEntry else None
            inner._tally(found, rejected=found is None)
            out.append(None if found is None else (found, entry.meta))
        return out

    def same_secret(self, other: object) -> bool:
        """Whether ``other`` is a SignedProgramCache under the same secret."""
        return isinstance(other, SignedProgramCache) and hmac.compare_digest(
            self._signer, other._signer
        )

    def set_entries_sealed(
        self, items: Sequence[tuple[CacheKey, CacheValue, bytes]]
    ) -> list[StoreOutcome]:
        """Store ``(key, payload, stored metadata)`` as :meth:`get_entries_sealed` of a
        handle under the same secret (:meth:`same_secret`) answered them -- verified
        there, and what :meth:`set_entries` would write here -- through the inner
        cache's batch write, signing nothing; their outcomes. (Metadata whose
        envelope does not verify under this secret would be stored as it is and
        rejected by every read: never served.)"""
        return [o or STORED_OUTCOME for o in self._inner.set_entries(items)]

    def _entries_of(self, ks: list[bytes]) -> list[CacheEntry | None]:
        """The inner cache's entries of ``ks``, uncounted where it can be asked so."""
        inner = self._inner
        if isinstance(inner, DriverCache) and inner._driver.read_many is not None:
            return inner.get_entries(ks, count=False)
        return [lookup_of(inner, k, False) for k in ks]

    def set_entry(self, key: CacheKey, value: CacheValue, meta: bytes = b"") -> StoreOutcome:
        """Sign and store through the inner cache; its outcome."""
        k = coerce_key(key)
        data = coerce_value(value, f"{type(self._inner).__name__}.__setitem__")
        check_meta(meta)
        envelope = b"".join((_MAGIC, bytes((_VERSION,)), self._sign(key_digest(k), data, meta)))
        return self._inner.set_entry(k, data, envelope + meta) or STORED_OUTCOME

    def set_entries(
        self, items: Iterable[tuple[CacheKey, CacheValue, bytes]]
    ) -> Sequence[StoreOutcome]:
        """Sign each and store them through the inner cache's batch write; their
        outcomes."""
        signed: list[tuple[CacheKey, CacheValue, bytes]] = []
        for key, value, meta in items:
            k = coerce_key(key)
            data = coerce_value(value, f"{type(self._inner).__name__}.set_entries")
            check_meta(meta)
            envelope = b"".join((_MAGIC, bytes((_VERSION,)), self._sign(key_digest(k), data, meta)))
            signed.append((k, data, envelope + meta))
        return [o or STORED_OUTCOME for o in self._inner.set_entries(signed)]

    def __setitem__(self, key: CacheKey, value: CacheValue) -> None:
        self.set_entry(key, value)

    def __delitem__(self, key: CacheKey) -> None:
        del self._inner[key]

    def __len__(self) -> int:
        return len(self._inner)

    def clear(self) -> None:
        self._inner.clear()

    # -- listing and maintenance ----------------------------------------------------------
    def iter_entries(self) -> Iterator[EntryInfo]:
        """The inner listing with the signature envelope taken off the metadata."""
        for info in self._inner.iter_entries():
            meta = info.meta
            if meta is not None and len(meta) >= _ENVELOPE and meta[:4] == _MAGIC:
                info = info._replace(meta=meta[_ENVELOPE:])
            yield info

    def check_entry(self, entry_id: str) -> str | None:
        problem = self._inner.check_entry(entry_id)  # KeyError when absent
        if problem is not None:
            return problem
        entry = self._inner.read_entry(entry_id)
        if entry is None:
            return "entry changed or vanished while it was checked"
        result = self._verify(bytes.fromhex(entry_id), entry)
        return None if isinstance(result, CacheEntry) else result

    def read_entry(self, entry_id: str) -> CacheEntry | None:
        entry = self._inner.read_entry(entry_id)
        if entry is None:
            return None
        result = self._verify(bytes.fromhex(entry_id), entry)
        return result if type(result) is CacheEntry else None

    def remove_entry(self, entry_id: str) -> bool:
        return self._inner.remove_entry(entry_id)

    # -- the rest is the inner cache's ----------------------------------------------------
    def lock(
        self, key: CacheKey, timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> AbstractContextManager[bool]:
        return self._inner.lock(key, timeout)

    def claim(
        self, key: CacheKey, timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> AbstractContextManager[tuple[bool, CacheEntry | None]]:
        """The inner cache's ``claim`` (``lock`` where it has none), yielding ``(held,
        entry)``: an entry it hands over is returned only when its signature verifies
        (then counted as a hit); a rejected one is left for the look-again, which
        counts it once as a miss and a ``signature_failure`` -- and where the inner
        claim let go of its lock to hand it over (a file lock's), the lock is taken
        again, as ``lock`` would have held it."""
        return self._claim(coerce_key(key), timeout)

    @contextmanager
    def _claim(self, k: bytes, timeout: float | None) -> Iterator[tuple[bool, CacheEntry | None]]:
        inner = self._inner
        if not isinstance(inner, DriverCache):
            with inner.lock(k, timeout) as held:
                yield held, None
            return
        start = monotonic()
        with inner.claim(k, timeout, count=False) as (held, entry):
            result = None if entry is None else self._verify(key_digest(k), entry)
            if type(result) is CacheEntry:
                inner._tally(result, True)
                yield held, result
                return
            if entry is None or held or inner.hands_over:
                yield held, None
                return
        # A file lock's claim let go of its lock to hand over this entry, refused here:
        # take the lock as lock() would have held it (after the claim, whose per-key
        # thread lock this takes again).
        left = None if timeout is None else max(0.0, timeout - (monotonic() - start))
        with inner.lock(k, left) as again:
            yield again, None

    def stats(self) -> CacheStats:
        return self._inner.stats()

    def total_stats(self) -> CacheStats:
        """The inner cache's totals (its ``stats()`` when it keeps no shared totals)."""
        return getattr(self._inner, "total_stats", self._inner.stats)()

    def zero_stats(self) -> None:
        """The inner cache's ``zero_stats()``: the counters this wrapper reports,
        ``signature_failures`` included, are the inner cache's (NotImplementedError
        where the inner backend cannot reset them)."""
        self._inner.zero_stats()

    def close(self) -> None:
        self._inner.close()

    def __repr__(self) -> str:
        return f"SignedProgramCache({self._inner!r})"
