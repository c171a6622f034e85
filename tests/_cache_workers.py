"""Subprocess workers for the cache-key and compile(cache=) tests.

Run as ``python tests/_cache_workers.py <command> <json args>``; each command
prints one JSON document on stdout. Kept in a script (not a test module) so that
every worker is a genuinely fresh interpreter: its own NVRTC load, its own
identity probes, its own hash seed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings

ARCH = "sm_90"

#: A tiny kernel; compiles in well under a second.
SRC = 'extern "C" __global__ void store_one(int* p) { *p = 1; }\n'

#: A template kernel, for name expressions (mangled names differ per instantiation).
TEMPLATE_SRC = r"""
template <typename T> __global__ void fill(T* p, T v) { p[threadIdx.x] = v; }
"""

#: Inputs whose keys must agree between processes: (code, code_type, target, names).
KEY_CASES = [
    (SRC, "c++", "cubin", ()),
    (SRC, "c++", "ptx", ()),
    (TEMPLATE_SRC, "c++", "cubin", ("fill<float>", b"fill<int>")),
]


def keys_for_cases() -> list[str]:
    """The hex keys of ``KEY_CASES`` under fixed options (same in every process)."""
    from cuforge.compile import ProgramOptions
    from cuforge.utils import make_program_cache_key

    options = ProgramOptions(arch=ARCH, std="c++17", define_macro=["A=1", "B"], ftz=True)
    return [
        make_program_cache_key(
            code=code,
            code_type=code_type,
            options=options,
            target_type=target,
            name_expressions=names,
        ).hex()
        for code, code_type, target, names in KEY_CASES
    ]


def count_compiles(counter: str) -> None:
    """Make every real NVRTC compile in this process append a line to ``counter``."""
    from cuforge.compile import _nvrtc

    real = _nvrtc.compile_cpp

    def counted(*args, **kwargs):
        with open(counter, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*args, **kwargs)

    _nvrtc.compile_cpp = counted


def wait_barrier(directory: str, parties: int, timeout: float = 60.0) -> None:
    """Announce this process in ``directory`` and wait until ``parties`` have."""
    open(os.path.join(directory, f"ready.{os.getpid()}"), "w").close()
    deadline = time.monotonic() + timeout
    while sum(n.startswith("ready.") for n in os.listdir(directory)) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError("barrier: not every worker arrived")
        time.sleep(0.001)


def cmd_keys(args: dict) -> dict:
    return {"keys": keys_for_cases()}


def cmd_compile(args: dict) -> dict:
    """Compile SRC to cubin through a FileStream cache at ``args["cache"]``."""
    from cuforge.compile import Program, ProgramOptions
    from cuforge.utils import FileStreamProgramCache

    if args.get("counter"):
        count_compiles(args["counter"])
    options = ProgramOptions(arch=ARCH)
    program = Program(args.get("src", SRC), "c++", options)
    with FileStreamProgramCache(args["cache"]) as cache:
        if args.get("barrier"):
            wait_barrier(args["barrier"], args["parties"])
        names = tuple(args.get("names", ()))
        obj = program.compile("cubin", name_expressions=names, cache=cache)
        stats = cache.stats().as_dict()
    return {
        "sha256": hashlib.sha256(obj.code).hexdigest(),
        "code_type": obj.code_type,
        "name": obj.name,
        "symbols": {str(k): v for k, v in obj.symbol_mapping.items()},
        "stats": stats,
    }


def cmd_hold(args: dict) -> dict:
    """Take the single-flight lock of SRC's cubin key, say so, and hold it forever."""
    from cuforge.compile import ProgramOptions
    from cuforge.utils import FileStreamProgramCache, make_program_cache_key

    key = make_program_cache_key(
        code=SRC, code_type="c++", options=ProgramOptions(arch=ARCH), target_type="cubin"
    )
    cache = FileStreamProgramCache(args["cache"])
    with cache.lock(key, timeout=10) as held:
        with open(args["ready"], "w") as f:
            f.write("held" if held else "not held")
        while True:
            time.sleep(60)


def cmd_efbig(args: dict) -> dict:
    """Compile through a FileStream cache with RLIMIT_FSIZE below the cubin's size."""
    import resource

    from cuforge.compile import Program, ProgramOptions
    from cuforge.utils import CacheWriteWarning, FileStreamProgramCache

    count_compiles(args["counter"])
    cache = FileStreamProgramCache(args["cache"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (args["limit"], args["limit"]))
    program = Program(SRC, "c++", ProgramOptions(arch=ARCH))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = program.compile("cubin", cache=cache)
        second = program.compile("cubin", cache=cache)
    fresh = Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin")
    return {
        "same_code": first.code == second.code == fresh.code,
        "elf": first.code[:4] == b"\x7fELF",
        "size": len(first.code),
        "write_warnings": [str(w.message) for w in caught if w.category is CacheWriteWarning],
        "other_warnings": [str(w.message) for w in caught if w.category is not CacheWriteWarning],
        "write_failures": cache.stats().write_failures,
        "stores": cache.stats().stores,
    }


def cmd_compile_url(args: dict) -> dict:
    """Compile ``args["sources"]`` (default: SRC) to cubin through ``open_cache(args["url"])``,
    or through ``cache=True`` (the environment's default cache) when no url is given."""
    from cuforge.compile import Program, ProgramOptions
    from cuforge.utils import open_cache

    if args.get("counter"):
        count_compiles(args["counter"])
    sources = args.get("sources") or [SRC]
    cache = open_cache(args["url"]) if args.get("url") else True
    if args.get("barrier"):
        wait_barrier(args["barrier"], args["parties"])
    digests = []
    for src in sources:
        obj = Program(src, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=cache)
        digests.append(hashlib.sha256(obj.code).hexdigest())
    stats = None
    if cache is not True:
        stats = cache.stats().as_dict()
        cache.close()
    return {"sha256": digests, "stats": stats}


def cmd_redis_hold(args: dict) -> dict:
    """Take the Redis single-flight lock of SRC's cubin key and hold it forever."""
    from cuforge.compile import ProgramOptions
    from cuforge.storage.redis import RedisProgramCache
    from cuforge.utils import make_program_cache_key

    key = make_program_cache_key(
        code=SRC, code_type="c++", options=ProgramOptions(arch=ARCH), target_type="cubin"
    )
    cache = RedisProgramCache(args["url"], lock_lease=args["lease"])
    with cache.lock(key, timeout=10) as held:
        with open(args["ready"], "w") as f:
            f.write("held" if held else "not held")
        while True:
            time.sleep(60)


def cmd_redis_traffic(args: dict) -> dict:
    """``hits`` hits and ``misses`` misses on a Redis cache, then close (flushes counters)."""
    from cuforge.storage.redis import RedisProgramCache

    cache = RedisProgramCache(args["url"], stats_every=args.get("stats_every", 64))
    cache[b"present"] = b"x" * 100
    for _ in range(args["hits"]):
        assert cache.get(b"present") is not None
    for i in range(args["misses"]):
        assert cache.get(b"absent-%d" % i) is None
    if args.get("close", True):
        cache.close()
    else:  # kept open until the interpreter exits, which flushes its counters
        _KEEP.append(cache)
    return {"stats": cache.stats().as_dict()}


def cmd_url_hold(args: dict) -> dict:
    """Take the single-flight lock of SRC's cubin key in ``open_cache(args["url"])``
    and hold it forever (until killed)."""
    from cuforge.compile import ProgramOptions
    from cuforge.utils import make_program_cache_key, open_cache

    key = make_program_cache_key(
        code=SRC, code_type="c++", options=ProgramOptions(arch=ARCH), target_type="cubin"
    )
    cache = open_cache(args["url"])
    with cache.lock(key, timeout=10) as held:
        with open(args["ready"], "w") as f:
            f.write("held" if held else "not held")
        while True:
            time.sleep(60)


def cmd_url_store_forever(args: dict) -> dict:
    """Store 64 KiB entries under fresh keys in ``open_cache(args["url"])`` until killed;
    ``ready`` is written after the first store."""
    from cuforge.utils import open_cache

    cache = open_cache(args["url"])
    i = 0
    while True:
        cache[b"w-%d-%d" % (os.getpid(), i)] = os.urandom(64 << 10)
        if i == 0:
            with open(args["ready"], "w") as f:
                f.write("stored")
        i += 1


_KEEP: list = []


COMMANDS = {
    "keys": cmd_keys,
    "compile": cmd_compile,
    "hold": cmd_hold,
    "efbig": cmd_efbig,
    "compile_url": cmd_compile_url,
    "redis_hold": cmd_redis_hold,
    "redis_traffic": cmd_redis_traffic,
    "url_hold": cmd_url_hold,
    "url_store_forever": cmd_url_store_forever,
}

if __name__ == "__main__":
    result = COMMANDS[sys.argv[1]](json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
    print(json.dumps(result))
