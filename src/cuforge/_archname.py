"""What an architecture name looks like: ``sm_90``, ``compute_90``, ``sm_90a``,
``compute_100f``.

One rule for the compile layer (``ProgramOptions.arch``) and the settings files'
``arch`` (``storage.settings``, which may not import the compile layer), so a file is
refused for exactly the names a compile refuses. Whether NVRTC compiles for the name,
or a cubin can be made for it, is the compile layer's and the command line's to say.
Stdlib only; nothing imported.
"""

from __future__ import annotations

__all__ = ["arch_ok"]


def arch_ok(text: str) -> bool:
    """Whether ``text`` is an arch: the whole of it matches
    ``(sm|compute)_(\\d{2,3})([af]?)`` (written out: ``re`` costs a cold process)."""
    prefix, underscore, number = text.partition("_")
    if not underscore or prefix not in ("sm", "compute"):
        return False
    if number[-1:] in ("a", "f"):
        number = number[:-1]
    return 2 <= len(number) <= 3 and number.isdecimal()
