"""The directory mirror: the cuforge cache behind JITs that have only a directory.

Warp, Numba (``cache=True``), PyTorch Inductor's C++ code cache, DeepGEMM,
FlashInfer, CuTe DSL, cuTile, TileLang and vLLM's compile cache keep compiled kernels
as files in a directory and have no cache hook. The mirror fills that directory from
a cuforge cache before the JIT runs (*hydrate*) and stores the files the JIT
completed (*publish*), so a fresh host or container starts warm::

    from cuforge.integrations.mirror import PROFILES, Mirror

    mirror = Mirror(PROFILES["warp"], "redis://cache-host/0")
    mirror.hydrate()               # before the JIT runs
    mirror.start_periodic(30.0)    # while it runs (a daemon thread)
    ...                            # the job
    mirror.stop()                  # publishes once more

API (``cuforge run`` calls exactly this):

- :data:`PROFILES` (``dict[str, Profile]``: the built-in ones),
  :func:`configured_profiles` (those plus the settings files' ``[mirror.<name>]``
  tables, the user's then the project's: the one set ``cuforge run``, ``session()``
  and :func:`active_profiles` use; ValueError naming the file and key for a bad one),
  :func:`load_profiles(extra, base) <load_profiles>` (the parser of such tables:
  keys ``env``, ``subdir``, ``default``, ``dists``, ``version_from``, ``skip``,
  ``only``, ``busy_while``, ``gpu_dependent``, ``host_dependent``, ``new_only``,
  ``bundle``, ``notes``), :func:`active_profiles(env) <active_profiles>` (installed, or its
  variable set).
- :class:`Profile`: name, variables naming the directory, the JIT's default
  directory, its version (distributions, or ``module:attribute``), skip globs,
  whether files depend on the GPU, notes.
- :class:`Mirror(profile, cache, directory=None, *, gpu=None) <Mirror>`:
  ``hydrate() -> HydrateResult``, ``publish() -> PublishResult``,
  ``start_periodic(interval_s)``, ``stop() -> PublishResult``. ``gpu``: for a
  GPU-dependent profile, the GPU identity keys name; the runner computes it once per
  job (default :func:`gpu_identity`: the GPU models the NVIDIA kernel module lists
  in ``/proc``, no driver call; without one such a mirror stays off).

Guarantees:

- Keys: profile, the JIT's version (its distributions' versions), the host's OS and
  machine, the GPU identity (GPU-dependent profiles only), the host identity
  (host-dependent profiles only: native code built for this CPU, C library and C++
  compiler), the file's relative path -- or, for files a profile's ``bundle`` says
  are valid only together (numba's index and the data files it numbers per host),
  the group's: one entry, a snapshot of one directory, so no host ever gets one
  host's index with another's data files.
- Hydrate writes only files whose bytes verify -- the cache's integrity and, with
  ``$CUFORGE_CACHE_SECRET``, its signature (an unsigned or foreign-signed entry is a
  miss), then the sha256 in the entry's record and in the index -- through a temp
  file in the same directory linked into place. It never follows a link, never
  writes over a local file the mirror did not write itself (a newer or differing
  one is kept and counted), and never over one changed since it wrote it. A
  bundle is written all or nothing, and only where no other file of its group
  stands.
- Publish stores only what the JIT completed: a regular file owned by this user, not
  a temp, lock or build name (the profile's skip globs), of the kinds the profile
  mirrors (``only``), without a marker saying it is still being built
  (``busy_while``), the same at two looks ``settle_s`` apart and while it is read
  whole. A file changed in place after the
  mirror recorded it is tampered with and never published; a directory every user
  can write publishes nothing. Payloads are opaque bytes: cuforge never loads,
  unpickles or runs them.
- Entries carry records of kind ``mirror`` (and ``mirror-index``), so ``cuforge cache
  ls/stats/verify/prune`` list and manage them with everything else.
- Fail-open: a cache or file-system fault is a :class:`CacheReadWarning` (hydrate) or
  :class:`CacheWriteWarning` (publish) and a result saying so, never an exception to
  the job.

What each JIT's directory depends on, and what the mirror cannot make hit, is in
each profile's ``notes`` (and docs/integrations.md).
"""

from __future__ import annotations

from .engine import ENV_CACHE, HydrateResult, Mirror, PublishResult
from .profiles import (
    ALWAYS_SKIP,
    PROFILES,
    Profile,
    active_profiles,
    configured_profiles,
    gpu_identity,
    host_identity,
    load_profiles,
)

__all__ = [
    "ALWAYS_SKIP",
    "ENV_CACHE",
    "PROFILES",
    "HydrateResult",
    "Mirror",
    "Profile",
    "PublishResult",
    "active_profiles",
    "configured_profiles",
    "gpu_identity",
    "host_identity",
    "load_profiles",
]
