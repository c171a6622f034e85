"""What the layers above compile (the CLI, ``cuforge.utils``) may ask about the
compiler and its headers: one deliberate seam instead of reaching into compile's
private modules (an internal seam: see docs/architecture.md, not public API).

Every function delegates to its private module at call time, so a CLI hit that
only reads the identity store imports nothing else; ``toolkit_headers`` is the very
function ``cuforge.utils`` exports, resolved on first use.
"""

from __future__ import annotations

from cuforge import _lazy
from cuforge.compile.cache import _identity_store

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    import contextlib

    from cuforge.compile.cache._toolkit import toolkit_headers as toolkit_headers

__all__ = [
    "STATE_ENV_VAR",
    "check_toolkit_setting",
    "key_facts",
    "nvjitlink_identity",
    "nvrtc_identity",
    "nvrtc_supported_archs",
    "nvvm_identity",
    "reading_only",
    "state_dir",
    "stored_fact",
    "toolkit_headers",
    "toolkit_include_dirs",
]

#: The variable that moves (or, set to ``off``, disables) cuforge's state directory.
STATE_ENV_VAR = _identity_store.ENV_VAR

# public name -> module that defines it
_EXPORTS = {"toolkit_headers": "cuforge.compile.cache._toolkit"}


def state_dir() -> str | None:
    """cuforge's state directory (identity records, CLI hit records); None when off."""
    return _identity_store.state_dir()


def reading_only() -> contextlib.AbstractContextManager[None]:
    """A block inside which the state directory's identity records are read, never
    written (``cuforge doctor`` changes nothing)."""
    return _identity_store.reading_only()


def stored_fact(fact: str) -> tuple[bytes, ...] | None:
    """The values the identity store keeps for ``fact`` while still current, or None."""
    return _identity_store.lookup(fact)


def key_facts() -> list[tuple[str, bytes]]:
    """(fact, current value) for each stored fact a plain C++ program's key is made
    from: the NVRTC build and the toolkit header set. Probes them if need be."""
    from cuforge.compile.cache import _identity, _toolkit

    return [
        ("nvrtc_identity", _identity.nvrtc_identity()),
        (_toolkit._FACT, _toolkit.toolkit_identity()),
    ]


def nvrtc_identity() -> bytes:
    """The exact NVRTC build (raises what the probe raises when NVRTC is missing)."""
    from cuforge.compile.cache import _identity

    return _identity.nvrtc_identity()


def nvjitlink_identity() -> bytes:
    """The exact nvJitLink build (raises what the probe raises when it is missing)."""
    from cuforge.compile.cache import _identity

    return _identity.nvjitlink_identity()


def nvvm_identity() -> bytes:
    """The exact libNVVM build (raises what the probe raises when it is missing)."""
    from cuforge.compile.cache import _identity

    return _identity.nvvm_identity()


def check_toolkit_setting() -> None:
    """ValueError naming ``CUFORGE_TOOLKIT_HEADERS`` when it names a directory that
    holds no toolkit (what the first C++ compile would raise); a few ``stat`` calls."""
    from cuforge.compile.cache import _toolkit

    _toolkit.check_setting()


def toolkit_include_dirs() -> tuple[str, ...]:
    """The CUDA header directories NVRTC searches after a program's own (located once
    per process); ValueError for a ``CUFORGE_TOOLKIT_HEADERS`` without a toolkit."""
    from cuforge.compile.cache import _toolkit

    return _toolkit.toolkit_include_dirs()


def nvrtc_supported_archs() -> tuple[tuple[int, int], tuple[int, ...]] | None:
    """NVRTC's (version, the compute capabilities it compiles for:
    ``nvrtcGetSupportedArchs``), or None when NVRTC cannot be loaded or cannot say.
    Kept by the identity store like the NVRTC build (a record read once known), so a
    check before a compile or a cache hit costs no bindings import."""
    from cuforge.compile.cache import _identity

    said = _identity.nvrtc_supported_archs()
    version, sep, listed = said.partition(b":")
    try:
        major, minor = (int(n) for n in version.split(b"."))
        archs = tuple(int(a) for a in listed.split(b",") if a)
    except ValueError:  # b"unavailable:..." (no NVRTC), or a record of another form
        return None
    return ((major, minor), archs) if sep and archs else None


__getattr__, __dir__ = _lazy.exports(__name__, _EXPORTS)
