"""What every integration shares (cache selection, foreign entries), and that
importing cuforge's integrations never imports the systems they adapt."""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from cuforge.integrations import cupy as cupy_module
from cuforge.integrations import inductor as inductor_module
from cuforge.integrations._cache import ForeignEntries, caching_off, select_cache
from cuforge.storage.base import CacheReadWarning, CacheWriteWarning, ProgramCacheResource
from cuforge.storage.memory import InMemoryProgramCache
from cuforge.storage.record import decode_record
from cuforge.storage.signing import SignedProgramCache
from cuforge.storage.urls import open_cache

SECRET = b"0123456789abcdef0123456789abcdef"


def test_importing_the_integrations_imports_no_framework() -> None:
    code = (
        "import sys, cuforge, cuforge.integrations, cuforge.integrations.inductor, "
        "cuforge.integrations.cupy\n"
        "print(sorted(m for m in ('torch', 'triton', 'cupy', 'redis') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_inductor_without_torch_is_one_line(tmp_path: Path) -> None:
    from cuforge.integrations import inductor

    with pytest.raises(RuntimeError, match=r"^cuforge.integrations.inductor needs torch") as e:
        inductor.install(str(tmp_path / "c"))
    assert "\n" not in str(e.value)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="cupy is installed")
def test_cupy_without_cupy_is_one_line(tmp_path: Path) -> None:
    from cuforge.integrations import cupy

    with pytest.raises(RuntimeError, match=r"^cuforge.integrations.cupy needs cupy") as e:
        cupy.install(str(tmp_path / "c"))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "c").exists()


def test_select_cache_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = InMemoryProgramCache()
    assert select_cache(given, "CUFORGE_X_CACHE") is given
    monkeypatch.setenv("CUFORGE_X_CACHE", "off")
    assert select_cache(None, "CUFORGE_X_CACHE") is None
    monkeypatch.setenv("CUFORGE_X_CACHE", str(tmp_path / "x"))
    monkeypatch.setenv("CUFORGE_CACHE", str(tmp_path / "general"))
    chosen = select_cache(None, "CUFORGE_X_CACHE")
    assert isinstance(chosen, ProgramCacheResource)
    chosen.set_entry(b"k", b"v")
    assert (tmp_path / "x").is_dir() and not (tmp_path / "general").exists()
    monkeypatch.delenv("CUFORGE_X_CACHE")
    from cuforge.storage.config import default_cache

    assert select_cache(None, "CUFORGE_X_CACHE") is default_cache()


def test_a_url_opens_once_per_process_and_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "c")
    monkeypatch.delenv("CUFORGE_CACHE_SECRET", raising=False)
    first = select_cache(url, "CUFORGE_X_CACHE")
    monkeypatch.setenv("CUFORGE_X_CACHE", url)
    assert select_cache(None, "CUFORGE_X_CACHE") is first  # one handle: one set of stats
    monkeypatch.setenv("CUFORGE_CACHE_SECRET", SECRET.decode())
    signed = select_cache(url, "CUFORGE_X_CACHE")
    assert signed is not first and isinstance(signed, SignedProgramCache)


def test_select_cache_bad_values_name_their_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_selection: None
) -> None:
    with pytest.raises(ValueError, match=r"^cache: "):
        select_cache("nosuch://x", "CUFORGE_X_CACHE")
    refused = {"sqlite://": "needs a database file", f"sqlite://{tmp_path}": "is a directory"}
    for url, why in refused.items():
        for _ in range(2):  # each call, not only the first
            with pytest.raises(ValueError, match=r"^cache: ") as err:
                select_cache(url, "CUFORGE_X_CACHE")
            assert why in str(err.value)
    with pytest.raises(TypeError, match=r"^cache: expected a ProgramCacheResource"):
        select_cache(42, "CUFORGE_X_CACHE")  # type: ignore[arg-type]
    # A variable never raises (it would fail every compile of the host system): it is
    # one warning naming the variable, and no cache.
    monkeypatch.setenv("CUFORGE_X_CACHE", "nosuch://x")
    with pytest.warns(CacheWriteWarning, match=r"^cuforge: \$CUFORGE_X_CACHE='nosuch://x': "):
        assert select_cache(None, "CUFORGE_X_CACHE") is None


@pytest.fixture
def fresh_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    """No handle, failure or warning remembered from another test; no cache variable."""
    from cuforge.integrations import _cache
    from cuforge.storage import config

    monkeypatch.setattr(_cache, "_opened", {})
    monkeypatch.setattr(_cache, "_failed", {}, raising=False)
    monkeypatch.setattr(_cache, "_warned", set(), raising=False)
    monkeypatch.setattr(config, "_current", None)
    for var in ("CUFORGE_CACHE", "CUFORGE_CACHE_SECRET", *ADAPTER_VARIABLES):
        monkeypatch.delenv(var, raising=False)


#: Every adapter's own variable (triton's module imports triton: its name is spelled).
ADAPTER_VARIABLES = (inductor_module.ENV_CACHE, cupy_module.ENV_CACHE, "CUFORGE_TRITON_CACHE")


def _unopenable(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A cache URL that cannot be opened, and what the warning must say about why."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (tmp_path / "dir").mkdir()
    if kind == "short-secret":
        monkeypatch.setenv("CUFORGE_CACHE_SECRET", "short")
    return {
        "proc": ("/proc/nope", "cannot be created"),
        "world-writable": (str(shared), "writable by every user"),
        "bare-sqlite": ("sqlite://", "needs a database file"),
        "sqlite-directory": (f"sqlite://{tmp_path / 'dir'}", "is a directory"),
        "sqlite-world-writable": (f"sqlite://{shared / 'c.db'}", "writable by every user"),
        "unknown-scheme": ("nosuch://x", "unknown scheme"),
        "short-secret": (str(tmp_path / "c"), "$CUFORGE_CACHE_SECRET must be at least"),
    }[kind]


UNOPENABLE = [
    "proc",
    "world-writable",
    "bare-sqlite",
    "sqlite-directory",
    "sqlite-world-writable",
    "unknown-scheme",
    "short-secret",
]


def _selected_twice(cache: str | None, env_var: str) -> tuple[list[object], list[str]]:
    """select_cache twice (every warning shown): the answers and the warnings' texts,
    each checked to be a CacheWriteWarning pointing at this file (the caller's line).
    Earlier tests' garbage is collected first: an unclosed socket it holds warns when
    collected (ResourceWarning), which is not select_cache's."""
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        answers: list[object] = [select_cache(cache, env_var) for _ in range(2)]
    assert [w.category for w in caught] == [CacheWriteWarning] * len(caught)
    assert all(w.filename == __file__ for w in caught)
    return answers, [str(w.message) for w in caught]


@pytest.mark.parametrize("env_var", ADAPTER_VARIABLES)
@pytest.mark.parametrize("kind", UNOPENABLE)
def test_an_adapter_variable_naming_a_cache_that_cannot_be_opened_warns_once(
    kind: str, env_var: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_selection: None
) -> None:
    # These raised from select_cache, so every compile of the host system (each
    # triton.compile builds a cache manager) raised too.
    url, why = _unopenable(kind, tmp_path, monkeypatch)
    monkeypatch.setenv(env_var, url)
    answers, messages = _selected_twice(None, env_var)
    assert answers == [None, None]
    assert len(messages) == 1  # once per process, not per compile
    (message,) = messages
    assert message.startswith(f"cuforge: ${env_var}={url!r}: the cache cannot be opened (")
    assert why in message and message.endswith("compiling without a cache")
    assert "\n" not in message


@pytest.mark.parametrize("kind", UNOPENABLE)
def test_cuforge_cache_naming_a_cache_that_cannot_be_opened_warns_once_in_an_adapter(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_selection: None
) -> None:
    # The adapter's own variable unset: $CUFORGE_CACHE selects (through the default
    # cache). A bad URL or secret there raised from every adapter.
    url, why = _unopenable(kind, tmp_path, monkeypatch)
    monkeypatch.setenv("CUFORGE_CACHE", url)
    answers, messages = _selected_twice(None, cupy_module.ENV_CACHE)
    assert answers == [None, None]
    assert len(messages) == 1
    (message,) = messages
    assert "$CUFORGE_CACHE" in message and why in message
    assert url.removeprefix("sqlite://").split("/c.db")[0] in message
    assert "\n" not in message
    # Unset, the default directory with a secret too short: the secret is named.
    monkeypatch.delenv("CUFORGE_CACHE")
    monkeypatch.setenv("CUFORGE_CACHE_SECRET", "short")
    answers, messages = _selected_twice(None, inductor_module.ENV_CACHE)
    assert answers == [None, None] and len(messages) == 1
    assert "$CUFORGE_CACHE_SECRET must be at least" in messages[0]


@pytest.mark.parametrize(
    "kind", ["proc", "world-writable", "sqlite-world-writable", "short-secret"]
)
def test_a_cache_argument_that_cannot_be_opened_warns_once(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_selection: None
) -> None:
    # The environment's faults (a path that cannot be created or is unsafe, a secret
    # too short) are a warning and no cache; they raised OSError / ValueError. (A URL
    # the parser or backend refuses stays a ValueError at the call: see above.)
    url, why = _unopenable(kind, tmp_path, monkeypatch)
    answers, messages = _selected_twice(url, "CUFORGE_X_CACHE")
    assert answers == [None, None]
    assert len(messages) == 1
    assert messages[0].startswith(f"cuforge: cache={url!r}: the cache cannot be opened (")
    assert why in messages[0]


def test_a_password_in_a_url_that_cannot_be_opened_is_not_shown(
    monkeypatch: pytest.MonkeyPatch, fresh_selection: None
) -> None:
    monkeypatch.setenv("CUFORGE_X_CACHE", "redis://user:hunter2@localhost/0?nosuch=1")
    answers, messages = _selected_twice(None, "CUFORGE_X_CACHE")
    assert answers == [None, None] and len(messages) == 1
    assert "hunter2" not in messages[0] and "user:***@localhost" in messages[0]


def test_foreign_entries_carry_a_record_and_stay_apart(tmp_path: Path) -> None:
    cache = open_cache(str(tmp_path / "c"), secret=None)
    inductor = ForeignEntries(cache, "inductor")
    cupy = ForeignEntries(cache, "cupy")
    assert inductor.store("k1", b"payload", {"cache": "fx_graph"})
    assert inductor.load("k1") == b"payload"
    assert cupy.load("k1") is None  # another system's name space
    assert inductor.load("k2") is None
    (info,) = list(cache.iter_entries())
    record = decode_record(info.meta)
    assert record is not None
    assert (record["kind"], record["key"], record["cache"]) == ("inductor", "k1", "fx_graph")
    # An entry at the key whose record is not this kind's (or not for this name) is a miss.
    cache.set_entry(inductor.key("k3"), b"raw bytes")
    assert inductor.load("k3") is None


def test_foreign_entries_signed_rejects_unsigned_and_foreign_signed(tmp_path: Path) -> None:
    inner = open_cache(str(tmp_path / "c"), secret=None)
    ForeignEntries(inner, "cupy").store("n", b"planted", {})
    signed = ForeignEntries(SignedProgramCache(inner, SECRET), "cupy")
    assert signed.load("n") is None
    ForeignEntries(SignedProgramCache(inner, SECRET[::-1]), "cupy").store("n", b"other", {})
    assert signed.load("n") is None
    assert signed.cache.stats().signature_failures == 2
    signed.store("n", b"ours", {})
    assert signed.load("n") == b"ours"


class _Broken(InMemoryProgramCache):
    def get_entry(self, key):  # type: ignore[no-untyped-def]
        raise OSError("disk on fire")

    def set_entry(self, key, value, meta=b""):  # type: ignore[no-untyped-def]
        raise OSError("disk on fire")


def test_a_cache_fault_is_a_miss_or_a_dropped_store_with_a_warning() -> None:
    entries = ForeignEntries(_Broken(), "cupy")
    with pytest.warns(CacheReadWarning, match="lookup failed.*disk on fire"):
        assert entries.load("n") is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert entries.store("n", b"x", {}) is False
    assert [w.category.__name__ for w in caught] == ["CacheWriteWarning"]
    assert caught[0].filename == __file__


def test_cli_lists_an_integrations_entries_by_kind(tmp_path: Path) -> None:
    import json

    cache = open_cache(str(tmp_path / "c"), secret=None)
    ForeignEntries(cache, "inductor").store("pt2:fx-graph-v1::abc:c1", b"{}", {"cache": "fx"})
    ForeignEntries(cache, "cupy").store("0123abcd.cubin", b"\x7fELF", {})
    cache.close()

    def cli(*args: str) -> object:
        out = subprocess.run(
            [sys.executable, "-m", "cuforge", "cache", *args, "--cache", str(tmp_path / "c"),
             "--json"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return json.loads(out)

    def ls(kind: str) -> list[tuple[str, str]]:
        return [(e["kind"], e["name"]) for e in cli("ls", "--kind", kind)]  # type: ignore[attr-defined]

    assert ls("inductor") == [("inductor", "pt2:fx-graph-v1::abc:c1")]
    assert ls("cupy") == [("cupy", "0123abcd.cubin")]
    assert cli("stats")["kinds"] == {"inductor": 1, "cupy": 1}  # type: ignore[index]
    verified = cli("verify")
    assert (verified["checked"], verified["bad"]) == (2, [])  # type: ignore[index]


# -- one precedence with the API and the CLI (issue 33; issue 36, items 3 and 7) ----------
@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_selection: None) -> Path:
    """An empty working directory, no user settings file, nothing chosen yet."""
    from cuforge.storage import config

    monkeypatch.setattr(config, "_selections", {}, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("CUFORGE_CACHE_DIR", raising=False)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path / "work"


def _chosen(env_var: str) -> str | None:
    cache = select_cache(None, env_var)
    return None if cache is None else os.path.realpath(getattr(cache, "inner", cache).path)


def test_an_integration_chooses_by_the_one_precedence(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The adapters ignored $CUFORGE_CACHE_DIR and the settings files.
    (workdir / "cuforge.toml").write_text('cache = "project"\n')
    steps = [
        (None, None, str(workdir / "project")),
        ("CUFORGE_CACHE_DIR", "dir", str(workdir / "dir")),
        ("CUFORGE_CACHE", "url", str(workdir / "url")),
        ("CUFORGE_X_CACHE", "own", str(workdir / "own")),
        ("CUFORGE_X_CACHE", "off", None),
    ]
    for name, value, expected in steps:
        if name is not None:
            monkeypatch.setenv(name, str(value))
        assert _chosen("CUFORGE_X_CACHE") == expected, (name, value)
    assert caching_off("CUFORGE_X_CACHE")
    for name in ("CUFORGE_X_CACHE", "CUFORGE_CACHE"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("CUFORGE_CACHE_DIR", "off")  # off, at whatever level
    assert _chosen("CUFORGE_X_CACHE") is None and caching_off("CUFORGE_X_CACHE")
    monkeypatch.delenv("CUFORGE_CACHE_DIR")
    (workdir / "cuforge.toml").write_text('cache = "off"\n')
    assert _chosen("CUFORGE_Y_CACHE") is None and caching_off("CUFORGE_Y_CACHE")
    assert not (workdir / "off").exists()


def test_a_settings_files_secret_signs_an_integrations_cache(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workdir / "secret").write_text(SECRET.decode())
    (workdir / "cuforge.toml").write_text('secret_file = "secret"\n')
    monkeypatch.setenv("CUFORGE_X_CACHE", str(workdir / "c"))
    assert isinstance(select_cache(None, "CUFORGE_X_CACHE"), SignedProgramCache)
    assert isinstance(select_cache(str(workdir / "d"), "CUFORGE_X_CACHE"), SignedProgramCache)


@pytest.mark.parametrize("kind", ["bare-sqlite", "world-writable", "unknown-scheme"])
def test_a_settings_file_naming_a_cache_that_cannot_be_opened_warns_naming_it(
    kind: str, workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, why = _unopenable(kind, tmp_path, monkeypatch)
    toml = workdir / "cuforge.toml"
    toml.write_text(f"cache = {url!r}\n")
    answers, messages = _selected_twice(None, cupy_module.ENV_CACHE)
    assert answers == [None, None] and len(messages) == 1
    assert f"project config {toml}" in messages[0] and why in messages[0], messages
    assert "\n" not in messages[0]
