"""The child side of ``cuforge run``: what every Python process of the job does at
start-up (called from ``_boot/sitecustomize.py`` when ``$CUFORGE_RUN`` is set).

It wires JAX, Inductor, CuPy and Triton (``_wiring``) to the run's cache --
``$CUFORGE_CACHE``, which ``cuforge run`` sets -- when each is imported: a process
that imports none of them opens nothing and pays for one import hook. With
``$CUFORGE_RUN_JOURNAL`` (``cuforge run --warm-set``) the cache is wrapped in a
:class:`~cuforge.integrations.warmsets.Recorder` whose journal is
``$CUFORGE_RUN_JOURNAL/<pid>.keys``, and cuforge's own ``compile(cache=True)``
(the default cache, which ``$CUFORGE_CACHE`` makes the run's) goes through one too,
journal ``<pid>-compile.keys`` (``storage.config.wrap_default``; opened at the first
such compile); the ``cuforge`` command line's own compiles (``compile``, ``warm``,
and a hit its fast path serves) journal into ``<pid>-cli.keys``
(``warmsets.recording``, which names its journals by :func:`journal_file`). The
parent reads every journal when it publishes the warm set, so a process that is
killed has already told it what it touched. Nothing here raises: a failure is one
warning, and the job runs.
"""

from __future__ import annotations

import os

from cuforge.storage.base import ProgramCacheResource

__all__ = ["ENV_JOURNAL", "ENV_RUN", "journal_file", "start"]

ENV_RUN = "CUFORGE_RUN"
ENV_JOURNAL = "CUFORGE_RUN_JOURNAL"
ENV_SYSTEMS = "CUFORGE_RUN_SYSTEMS"

_started: list[object] = []


def _open() -> ProgramCacheResource | None:
    from ._cache import select_cache

    cache = select_cache(None, "CUFORGE_CACHE")
    journal = os.environ.get(ENV_JOURNAL)
    if cache is None or not journal:
        return cache
    from .warmsets import Recorder

    return Recorder(cache, os.path.join(journal, f"{os.getpid()}.keys"))


def journal_file(tag: str) -> str | None:
    """This process's journal ``<pid>-<tag>.keys`` in the run's journal directory when
    the process belongs to a ``cuforge run --warm-set`` job (``$CUFORGE_RUN`` and
    ``$CUFORGE_RUN_JOURNAL`` set); None otherwise."""
    directory = os.environ.get(ENV_JOURNAL)
    if not directory or not os.environ.get(ENV_RUN):
        return None
    return os.path.join(directory, f"{os.getpid()}-{tag}.keys")


def _record_default(journal: str) -> None:
    """``compile(cache=True)`` in this process records into ``journal`` (the run's
    warm set): the default cache is handed out in a Recorder."""
    from cuforge.storage import config

    def wrap(cache: ProgramCacheResource) -> ProgramCacheResource:
        from .warmsets import Recorder

        return Recorder(cache, journal)

    config.wrap_default(wrap)


def start() -> None:
    """Wire this process's JITs (once per process)."""
    if _started:
        return
    try:
        from ._wiring import SYSTEMS, Wiring

        journal = journal_file("compile")
        if journal is not None:
            _record_default(journal)
        chosen = os.environ.get(ENV_SYSTEMS)
        systems = SYSTEMS if not chosen else tuple(s for s in chosen.split(",") if s in SYSTEMS)
        _started.append(Wiring(_open, systems).start())
    except Exception as exc:  # never the job's failure
        import warnings

        from cuforge.storage.base import CacheWriteWarning

        warnings.warn(
            f"cuforge run: JITs not wired ({type(exc).__name__}: {exc})",
            CacheWriteWarning,
            stacklevel=2,
        )
