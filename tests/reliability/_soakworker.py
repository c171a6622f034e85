"""One process of the concurrency soak: mixed operations on one cache for a while.

    python _soakworker.py <spec-json> <index> <result.json>

``spec``: ``url`` (opened with ``open_cache``; ``secret`` signs it), ``seconds``,
``threads`` (threads in this process), ``keys`` and ``max_value`` (the key pool and
value sizes), ``programs`` ([source, sha256 of its uncached cubin] pairs), ``start``
(a wall-clock time to begin at, so every process starts together).

Operations, by weight: get 50, set 30, delete 5, compile 4, clear 0.02, listing
(len) 0.1 -- under the cache's cap, so stores evict. Every value describes its key
(``_selfdesc``): a get that returns anything but an intact value of its key is a
wrong byte; a compile that returns anything but the uncached cubin is wrong code; any
exception is counted. The result is the counts as JSON.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import sys
import threading
import time
import traceback
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _selfdesc

ARCH = "sm_90"


def open_it(spec: dict[str, Any]) -> Any:
    from cuforge.utils import open_cache

    return open_cache(spec["url"], secret=spec.get("secret"))


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: dict[str, int] = {}
        self.hits = self.misses = self.wrong = self.exceptions = self.wrong_code = 0
        self.examples: list[str] = []

    def bad(self, what: str, text: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)
            if len(self.examples) < 5:
                self.examples.append(text)


def run(spec: dict[str, Any], index: int, cache: Any, counts: Counts) -> None:
    from cuforge.compile import Program, ProgramOptions

    rng = random.Random(index * 7919 + threading.get_ident())
    pool = [f"soak-{i}".encode() for i in range(spec["keys"])]
    programs = spec["programs"]
    options = ProgramOptions(arch=ARCH)
    deadline = spec["start"] + spec["seconds"]
    halfway = spec["start"] + spec["seconds"] / 2 if index == 0 else None
    ops = counts.ops
    while time.time() < deadline:
        roll = rng.random() * 89.12
        if halfway is not None and time.time() >= halfway:
            roll, halfway = 89.01, None  # one clear() for sure, whatever the dice say
        key = rng.choice(pool)
        try:
            if roll < 50:
                op = "get"
                entry = cache.get_entry(key)
                if entry is None:
                    counts.misses += 1
                else:
                    problem = _selfdesc.problem(key, entry.data)
                    problem = problem or _selfdesc.meta_problem(key, entry.meta)
                    if problem:
                        counts.bad("wrong", f"get {key!r}: {problem}")
                    else:
                        counts.hits += 1
            elif roll < 80:
                op = "set"
                version = rng.randrange(1 << 30)
                value = _selfdesc.make(key, version, rng.randrange(64, spec["max_value"]))
                cache.set_entry(key, value, _selfdesc.make_meta(key, version))
            elif roll < 85:
                op = "delete"
                with contextlib.suppress(KeyError):
                    del cache[key]
            elif roll < 89:
                op = "compile"
                src, digest = programs[rng.randrange(len(programs))]
                obj = Program(src, "c++", options).compile("cubin", cache=cache)
                if hashlib.sha256(obj.code).hexdigest() != digest:
                    counts.bad("wrong_code", f"compile returned {len(obj.code)} other bytes")
            elif roll < 89.02:
                op = "clear"
                cache.clear()
            else:
                op = "len"
                len(cache)
        except Exception as exc:
            counts.bad("exceptions", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            continue
        ops[op] = ops.get(op, 0) + 1


def main() -> None:
    spec = json.loads(sys.argv[1])
    index = int(sys.argv[2])
    counts = Counts()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = open_it(spec)
        delay = spec["start"] - time.time()
        if delay > 0:
            time.sleep(delay)
        threads = [
            threading.Thread(target=run, args=(spec, index, cache, counts))
            for _ in range(spec["threads"])
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = cache.stats().as_dict()
        cache.close()
    result = {
        "ops": counts.ops,
        "hits": counts.hits,
        "misses": counts.misses,
        "wrong": counts.wrong,
        "wrong_code": counts.wrong_code,
        "exceptions": counts.exceptions,
        "examples": counts.examples,
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
        "stats": stats,
    }
    with open(sys.argv[3], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
