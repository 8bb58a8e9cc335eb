"""Real ``redis-server`` processes for the tests: one server, or a 3-node Redis Cluster.

Each server is started by this module on a free loopback port with no persistence and a
private temp directory, and is stopped, killed, paused (SIGSTOP: the kernel still accepts
connections, the server never answers) or resumed by its own PID, never by name. The shared
Redis on 6379 (if any) is never touched.

>>> with RedisServer() as server:          # doctest: +SKIP
...     server.pause()                      # black-holed
...     server.resume()
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO

STARTUP_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000, which must be <= 65535) is free too."""
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(20000, 55535)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _parse_reply(data: bytes) -> tuple[bytes, bytes] | None:
    """(reply, rest) for one complete status/error/integer/bulk reply at the start of data."""
    head, sep, rest = data.partition(b"\r\n")
    if not sep:
        return None
    if not head.startswith(b"$"):
        return head, rest
    size = int(head[1:])
    if size < 0:
        return b"", rest
    if len(rest) < size + 2:
        return None
    return rest[:size], rest[size + 2 :]


def _command(port: int, command: bytes, timeout: float = 0.5, replies: int = 1) -> bytes:
    """Inline command(s) over a raw socket (no client library, nothing left open).

    Returns the last raw reply: a status/error/integer line, or a bulk string's payload.
    """
    with socket.create_connection(("127.0.0.1", port), timeout) as sock:
        sock.sendall(command + b"\r\n")
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"connection closed after {data!r}")
            data += chunk
            parsed: list[bytes] = []
            rest = data
            while len(parsed) < replies and (one := _parse_reply(rest)) is not None:
                parsed.append(one[0])
                rest = one[1]
            if len(parsed) == replies:
                return parsed[-1]


class RedisServer:
    """A ``redis-server`` of our own on ``127.0.0.1:port`` (a free port unless given)."""

    def __init__(
        self,
        port: int | None = None,
        *,
        password: str | None = None,
        unix_socket: bool = False,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.port = port if port is not None else free_port()
        self._dir = Path(tempfile.mkdtemp(prefix=f"gw-redis-{self.port}-"))
        self.password = password
        self.socket_path = self._dir / "redis.sock" if unix_socket else None
        self.extra_args = extra_args
        if password is not None:
            self.extra_args += ("--requirepass", password)
        if self.socket_path is not None:
            self.extra_args += ("--unixsocket", str(self.socket_path), "--unixsocketperm", "700")
        self._log: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._owns_dir = True

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def unix_url(self) -> str:
        assert self.socket_path is not None, "started without unix_socket=True"
        return f"unix://{self.socket_path}?db=0"

    @property
    def pid(self) -> int:
        assert self._proc is not None, "server not started"
        return self._proc.pid

    @property
    def log_path(self) -> Path:
        return self._dir / "redis.log"

    def _args(self) -> list[str]:
        return [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self._dir),
            "--daemonize", "no",
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> RedisServer:
        assert self._proc is None or self._proc.poll() is not None, "already running"
        self._close_log()
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            self._args(), stdout=self._log, stderr=subprocess.STDOUT, cwd=self._dir
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server on port {self.port} exited with {self._proc.returncode}: "
                    + self.log_path.read_text(errors="replace")[-2000:]
                )
            with contextlib.suppress(OSError):
                if _command(self.port, b"PING").startswith((b"+PONG", b"-NOAUTH")):
                    return
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING")

    def command(self, command: bytes) -> bytes:
        """Send one inline command (e.g. ``b"FLUSHALL"``) and return the raw reply."""
        if self.password is not None:
            command = b"AUTH " + self.password.encode() + b"\r\n" + command
            return _command(self.port, command, replies=2)
        return _command(self.port, command)

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, sig)

    def pause(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel, nothing is answered."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _reap(self, timeout: float = 10.0) -> None:
        if self._proc is None:
            return
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout)

    def stop(self) -> None:
        """SIGTERM (after SIGCONT, in case it is paused) and wait for the exit."""
        if self._proc is not None and self._proc.poll() is None:
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGTERM)
        self._reap()

    def kill(self) -> None:
        """SIGKILL: the port is closed at once, connections are reset."""
        self._signal(signal.SIGKILL)
        self._reap()

    def restart(self) -> RedisServer:
        """Start again on the same port (after stop or kill; stops a running one first)."""
        self.stop()
        return self.start()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        self._close_log()
        if self._owns_dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        if self._proc is None:
            try:
                self.start()
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RedisCluster:
    """``nodes`` primaries (no replicas) on free ports, joined with ``redis-cli --cluster``."""

    def __init__(self, nodes: int = 3) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="gw-redis-cluster-"))
        self.servers: list[RedisServer] = []
        for _ in range(nodes):
            port = free_cluster_port()
            server = RedisServer(
                port,
                extra_args=(
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", str(self._dir / f"nodes-{port}.conf"),
                    "--cluster-node-timeout", "5000",
                ),
            )  # fmt: skip
            self.servers.append(server)

    @property
    def url(self) -> str:
        """A startup node; the client discovers the others."""
        return f"redis://127.0.0.1:{self.servers[0].port}"

    def start(self) -> RedisCluster:
        try:
            for server in self.servers:
                server.start()
            subprocess.run(
                [
                    "redis-cli", "--cluster", "create",
                    *(f"127.0.0.1:{s.port}" for s in self.servers),
                    "--cluster-replicas", "0", "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )  # fmt: skip
            self._wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if all(b"cluster_state:ok" in s.command(b"CLUSTER INFO") for s in self.servers):
                    return
            time.sleep(0.05)
        raise RuntimeError("cluster did not reach cluster_state:ok")

    def stop(self) -> None:
        for server in self.servers:
            server.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
