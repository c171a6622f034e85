"""The differential oracle's world: sources, headers, include directories and symlinks
in a temporary tree, and every change the oracle makes to it (issue 32).

::

    src/k.cu, src/p.cu     k reads "config.h" (and "extra.h" where one is found);
                           p reads no user header (the CLI's fast hit path serves it)
    src/config.h           absent at first; when present it shadows every -I directory
    gen/, gen.new/         config.h (#include "part.h" + VALUE) and part.h (PART)
    sub/gen/               the same, for relative -I paths seen from the working
                           directory sub/
    inc/config.h           -> ../shared/current/config.h
    shared/current         -> v1 (or v2): shared/v1/config.h, shared/v2/config.h
    tk/A, tk/B             toy CUDA toolkits for CUFORGE_TOOLKIT_HEADERS: their
                           include/oracle_tk.h defines TK
    caches/                fs (FileStream: the API, the CLI), api.db (SQLite),
                           tier-fs (the tier's file level), warm (cuforge warm's)

Every header write takes a fresh number from one counter, so a stale artifact names
the value it was compiled from. Both kernels embed what they were compiled from as a
string in the binary (``oracle{...}``, see :func:`describe`): a failure shows
``VALUE=103`` where ``VALUE=104`` was expected, not two blobs.

The compile inputs a step can change -- the device's arch (the one query a test
may stand in for: ``_versions.current_device_arch`` in process, ``TEST_DEVICE0_ARCH``
through ``tests/_fake_device.py`` for the CLI), an explicit ``--arch``, the include
path and its spelling, the working directory, ``-D``, ``--std`` and
``CUFORGE_TOOLKIT_HEADERS`` -- are plain fields here; :meth:`World.jobs` turns them
into what every path compiles.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: What every path compiles to (the CLI's default; what its fast hit path records).
TARGET = "cubin"
# The choices a step draws from. Each list starts with a value other than the world's
# initial one: hypothesis tries first elements first, and a first step that changes
# nothing would test nothing.
DEVICE_ARCHS = ("sm_80", "sm_90", "sm_86")
EXPLICIT_ARCHS = ("sm_80", None, "sm_90")
DEFINES = ("ORACLE_D=1", None, "ORACLE_D=2")
STDS = ("c++20", None, "c++17")
TOOLKITS = ("A", None, "B", "off")
#: Include path choices: a bare name is relative to the working directory, "@name"
#: is the absolute path of the world's directory of that name.
INCLUDE_PATHS = (
    ("inc",), ("gen",), ("gen", "inc"), ("inc", "gen"), ("@gen",), ("@inc", "gen"),
    ("gen.new",), (),
)  # fmt: skip
CWDS = ("sub", ".")
#: Headers an edit may rewrite; inc/config.h writes through its symlinks.
HEADERS = (
    "gen/config.h", "gen/part.h", "gen.new/config.h", "sub/gen/config.h",
    "shared/v1/config.h", "shared/v2/config.h", "inc/config.h", "src/config.h",
)  # fmt: skip
GEN_DIRS = ("gen", "gen.new", "sub/gen")
#: Directories a step may delete, recreate or leave empty.
RECREATABLE = ("gen", "sub/gen", "shared/v1", "inc")
SWAPS = (("gen", "gen.new"), ("shared/v1", "shared/v2"))
#: Symlinks a step may re-point, and the targets each may get.
LINKS = {
    "shared/current": ("v1", "v2"),
    "inc/config.h": ("../shared/current/config.h", "../gen.new/config.h"),
}
EXTRA_DIRS = ("src", "gen", "inc")

_TAIL = r"""
#ifndef PART
#define PART 0
#endif
#ifndef EXTRA
#define EXTRA 0
#endif
#ifndef TK
#define TK 0
#endif
#ifndef ORACLE_D
#define ORACLE_D 0
#endif
#define ORACLE_S2(x) #x
#define ORACLE_S(x) ORACLE_S2(x)
"""
K_SOURCE = (
    '#include "config.h"\n'
    '#if __has_include("extra.h")\n#include "extra.h"\n#endif\n'
    "#if __has_include(<oracle_tk.h>)\n#include <oracle_tk.h>\n#endif\n"
    + _TAIL
    + 'extern "C" __device__ const char oracle_tag[] = "oracle{k VALUE=" ORACLE_S(VALUE)\n'
    '    " PART=" ORACLE_S(PART) " EXTRA=" ORACLE_S(EXTRA) " D=" ORACLE_S(ORACLE_D)\n'
    '    " TK=" ORACLE_S(TK) " ARCH=" ORACLE_S(__CUDA_ARCH__) " STD=" ORACLE_S(__cplusplus) "}";\n'
    'extern "C" __global__ void k(int* a) { *a = VALUE + PART + EXTRA; }\n'
)
P_SOURCE = (
    "#if __has_include(<oracle_tk.h>)\n#include <oracle_tk.h>\n#endif\n"
    + _TAIL
    + 'extern "C" __device__ const char oracle_tag[] = "oracle{p D=" ORACLE_S(ORACLE_D)\n'
    '    " TK=" ORACLE_S(TK) " ARCH=" ORACLE_S(__CUDA_ARCH__) " STD=" ORACLE_S(__cplusplus) "}";\n'
    'extern "C" __global__ void p(int* a) { *a = ORACLE_D + TK; }\n'
)
_TAG = re.compile(rb"oracle\{[^}]*\}")


def describe(code: bytes) -> str:
    """What a binary was compiled from (its ``oracle{...}`` tag), for reports."""
    found = _TAG.findall(code)
    return found[0].decode() if found else f"<{len(code)} bytes without a tag>"


@dataclass
class Job:
    """One program as every path compiles it: ``fields`` are ProgramOptions' (arch
    None: the device's), ``cli`` the same as ``cuforge compile`` arguments."""

    label: str
    source: str  # relative to the working directory, as the CLI is given it
    code: str
    fields: dict[str, Any]
    cli: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "source": self.source, "code": self.code,
                "fields": self.fields, "cli": self.cli}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        return cls(data["label"], data["source"], data["code"], data["fields"], data["cli"])


@dataclass
class World:
    """The tree and the compile inputs; each change method logs one line."""

    root: Path
    device_arch: str = "sm_90"
    arch: str | None = None
    includes: tuple[str, ...] = ("gen",)
    cwd: str = "."
    define: str | None = None
    std: str | None = None
    toolkit: str | None = None
    log: list[str] = field(default_factory=list)
    _counter: int = 100

    def __post_init__(self) -> None:
        r = self.root
        for d in ("src", "caches", "out", *GEN_DIRS, "shared/v1", "shared/v2", "inc"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "src" / "k.cu").write_text(K_SOURCE)
        (r / "src" / "p.cu").write_text(P_SOURCE)
        for d in GEN_DIRS:
            self._fill(d)
        for v in ("v1", "v2"):
            self._write(f"shared/{v}/config.h", f"#define VALUE {self._next()}\n")
        (r / "shared" / "current").symlink_to("v1")
        (r / "inc" / "config.h").symlink_to("../shared/current/config.h")
        for name, tk in (("A", 1), ("B", 22)):  # sizes differ: the toolkit identity sees it
            inc = r / "tk" / name / "include"
            inc.mkdir(parents=True)
            (inc / "cuda_runtime.h").write_text("/* a toy toolkit for the oracle */\n")
            (inc / "oracle_tk.h").write_text(f"#define TK {tk}\n")

    # -- helpers -----------------------------------------------------------------------
    def _next(self) -> int:
        self._counter += 1
        return self._counter

    def _write(self, rel: str, text: str) -> None:
        (self.root / rel).write_text(text)

    def _fill(self, d: str) -> str:
        value, part = self._next(), self._next()
        self._write(f"{d}/config.h", f'#include "part.h"\n#define VALUE {value}\n')
        self._write(f"{d}/part.h", f"#define PART {part}\n")
        return f"VALUE={value} PART={part}"

    @property
    def cwd_path(self) -> Path:
        return self.root / self.cwd

    def spell(self, token: str) -> str:
        """An include path token as the compile is given it (see INCLUDE_PATHS)."""
        return str(self.root / token[1:]) if token.startswith("@") else token

    def toolkit_env(self) -> dict[str, str]:
        """CUFORGE_TOOLKIT_HEADERS for the processes a step starts."""
        if self.toolkit is None:
            return {}
        value = "off" if self.toolkit == "off" else str(self.root / "tk" / self.toolkit)
        return {"CUFORGE_TOOLKIT_HEADERS": value}

    def effective_arch(self) -> str:
        return self.arch or self.device_arch

    def jobs(self) -> list[Job]:
        """k and p with the current options, sources named relative to the working
        directory exactly as the CLI names them (k by the path given: it has a quoted
        include; p by its basename)."""
        src = os.path.relpath(self.root / "src", self.cwd_path)
        common: dict[str, Any] = {
            "arch": self.arch,
            "define_macro": [self.define] if self.define else None,
            "std": self.std,
        }
        flags = (["--arch", self.arch] if self.arch else []) + (
            ["-D", self.define] if self.define else []
        )
        flags += ["--std", self.std] if self.std else []
        includes = [self.spell(t) for t in self.includes]
        k_source, p_source = f"{src}/k.cu", f"{src}/p.cu"
        k = Job("k", k_source, K_SOURCE, {"name": k_source, **common,
                "include_path": includes or None},
                [k_source, *flags, *(a for i in includes for a in ("-I", i))])  # fmt: skip
        p = Job("p", p_source, P_SOURCE, {"name": "p.cu", **common}, [p_source, *flags])
        return [k, p]

    def header_in_use(self) -> str | None:
        """The config.h k reads now (relative to the root, as spelled on the search
        path: beside the source, then each -I directory), or None when none is found."""
        candidates = [self.root / "src"] + [self.cwd_path / self.spell(t) for t in self.includes]
        for d in candidates:
            if (d / "config.h").is_file():
                return os.path.relpath(d / "config.h", self.root)
        return None

    # -- changes -------------------------------------------------------------------------
    def edit_header_in_use(self, how: str) -> None:
        """Edit the header k reads now (see :meth:`header_in_use`)."""
        rel = self.header_in_use()
        if rel is not None and not rel.startswith(".."):
            self.edit_header(rel, how)

    def change_dir_in_use(self, how: str) -> None:
        """Replace what the header in use is found through: "recreate" its directory
        (rm -rf, mkdir, new headers), "swap" it with its twin by rename (gen and
        gen.new, shared/v1 and shared/v2), or "repoint" the symlink it is reached
        through (else recreate)."""
        rel = self.header_in_use()
        if rel is None or rel.startswith(".."):
            return
        real = os.path.relpath(os.path.realpath(self.root / rel), self.root)
        d = os.path.dirname(real)
        if how == "repoint" and os.path.realpath(self.root / rel) != str(self.root / rel):
            link = "inc/config.h" if (self.root / "inc" / "config.h").is_symlink() else None
            if d.startswith("shared/") and (self.root / "shared" / "current").is_symlink():
                self.repoint("shared/current", "v2" if d == "shared/v1" else "v1")
            elif link is not None:
                self.repoint(link, LINKS[link][0] if "gen.new" in real else LINKS[link][1])
            return
        pair = next((p for p in SWAPS if d in p), None)
        if how == "swap" and pair is not None:
            self.swap_dirs(*pair)
        elif d != "src" and not d.startswith(".."):
            self.recreate_dir(d, "headers")

    def edit_header(self, rel: str, how: str) -> None:
        """Rewrite ``rel`` with a new value: "in place" (same inode) or "by rename"
        (a new file over it, as editors save). A header whose directory is gone is
        created with the directory."""
        path = self.root / rel
        name = "PART" if rel.endswith("part.h") else "VALUE"
        value = self._next()
        text = f"#define {name} {value}\n"
        if name == "VALUE" and os.path.dirname(rel) in GEN_DIRS:
            text = '#include "part.h"\n' + text
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            how = "(created)"
        if how == "in place":
            with open(path, "r+") as f:
                f.write(text)
                f.truncate()
        else:
            tmp = path.parent / f".{path.name}.tmp"
            tmp.write_text(text)
            os.replace(tmp, path)
        self.log.append(f"edit {rel} {how}: {name}={value}")

    def recreate_dir(self, rel: str, contents: str) -> None:
        """``rm -rf rel``, then (contents) "headers": mkdir and fill; "empty": mkdir;
        "absent": nothing."""
        path = self.root / rel
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
        note = contents
        if contents != "absent":
            path.mkdir(parents=True)
            if contents == "headers":
                if rel == "inc":
                    (path / "config.h").symlink_to("../shared/current/config.h")
                    note = "config.h -> ../shared/current/config.h"
                elif rel.startswith("shared/"):
                    value = self._next()
                    self._write(f"{rel}/config.h", f"#define VALUE {value}\n")
                    note = f"VALUE={value}"
                else:
                    note = self._fill(rel)
        self.log.append(f"rm -rf {rel}; {note}")

    def swap_dirs(self, a: str, b: str) -> None:
        """Swap two directories by rename (a -> a.swap, b -> a, a.swap -> b)."""
        pa, pb = self.root / a, self.root / b
        tmp = self.root / f"{a}.swap"
        if pa.exists():
            os.rename(pa, tmp)
        if pb.exists():
            os.rename(pb, pa)
        if tmp.exists():
            os.rename(tmp, pb)
        self.log.append(f"swap {a} <-> {b}")

    def repoint(self, link: str, target: str) -> None:
        """Re-point a symlink atomically, as ``ln -sfn`` does."""
        path = self.root / link
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True)
        tmp = path.parent / f".{path.name}.new"
        tmp.symlink_to(target)
        os.replace(tmp, path)
        self.log.append(f"ln -sfn {target} {link}")

    def set_extra(self, d: str, present: bool) -> None:
        """Create (a new value) or delete ``d/extra.h``."""
        path = self.root / d / "extra.h"
        if present and path.parent.is_dir():
            value = self._next()
            path.write_text(f"#define EXTRA {value}\n")
            self.log.append(f"write {d}/extra.h: EXTRA={value}")
        elif not present and path.exists():
            path.unlink()
            self.log.append(f"rm {d}/extra.h")

    def set_shadow(self, present: bool) -> None:
        """Create or delete src/config.h, which shadows every -I directory."""
        path = self.root / "src" / "config.h"
        if present:
            value = self._next()
            path.write_text(f"#define VALUE {value}\n")
            self.log.append(f"write src/config.h: VALUE={value}")
        elif path.exists():
            path.unlink()
            self.log.append("rm src/config.h")

    def set(self, **fields: Any) -> None:
        """Change compile inputs (device_arch, arch, includes, cwd, define, std, toolkit)."""
        for name, value in fields.items():
            setattr(self, name, value)
        self.log.append("set " + ", ".join(f"{k}={v!r}" for k, v in fields.items()))

    def state(self) -> str:
        """The compile inputs now, one line."""
        return (
            f"cwd={self.cwd!r} includes={list(self.includes)} device={self.device_arch} "
            f"arch={self.arch} define={self.define} std={self.std} toolkit={self.toolkit}"
        )
