"""``[admin] listen``: the admin API on a listener of its own (docs/spec.md §28). ``gateway
serve`` as its own process, on real sockets: the admin API and health answered there and only
there (404 on the gateway's port, fail closed), nothing else served there, with one process and
with ``--workers 2`` (the socket passed by fd); a port in use is one line and exit 3; SIGTERM
drains both listeners; a reload cannot move it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx2
import orjson
import pytest

from gateway.config import ConfigError
from gateway.server.supervisor import STARTUP_FAILURE
from tests.admin.admin_support import (
    ADMIN,
    ADMIN_KEY,
    admin_toml,
    bearer,
    chat,
    code,
    wait_for,
)
from tests.gateway_process import parse_head
from tests.h2.support import http2_client, make_certs
from tests.support import Process, free_port, gateway_cli, gateway_config, openai_client, wait_port
from tests.test_drain import children

LOG = '[logging]\naccess_log = "off"\nlevel = "info"\nformat = "text"\n'


def write_config(
    tmp_path: Path,
    port: int,
    listen: str,
    workers: int = 1,
    backend: str = "mock://",
    extra: str = "",
) -> Path:
    body = admin_toml(admin_extra=f'listen = "{listen}"\ndata_dir = "{tmp_path}"')
    body = body.replace('url = "mock://?output_tokens=3"', f'url = "{backend}"')
    path = tmp_path / f"gateway-{port}.toml"
    path.write_text(f"[server]\nport = {port}\nworkers = {workers}\n{LOG}\n{body}\n{extra}")
    return path


@contextlib.contextmanager
def serving(
    tmp_path: Path,
    workers: int = 1,
    backend: str = "mock://",
    host: str = "127.0.0.1",
    extra: str = "",
) -> Iterator[tuple[Process, int]]:
    """The gateway on a free port, its admin API on another; yields both (the admin port's
    process is the same one)."""
    port, admin_port = free_port(), free_port()
    listen = f"[{host}]:{admin_port}" if ":" in host else f"{host}:{admin_port}"
    path = write_config(tmp_path, port, listen, workers, backend, extra)
    proc = Process(gateway_cli("serve", "-c", str(path)), port)
    try:
        if host == "127.0.0.1":
            wait_port(admin_port, 15)
        yield proc, admin_port
    finally:
        proc.stop()


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def get(base: str, path: str, headers: dict[str, str] | None = None) -> httpx2.Response:
    with httpx2.Client(timeout=5) as client:
        return client.get(base + path, headers=headers)


def make_key(admin_url: str) -> str:
    with httpx2.Client(timeout=5) as client:
        made = client.post(f"{admin_url}/admin/v1/keys", json={"tenant": "t"}, headers=ADMIN)
    assert made.status_code == 201, made.text
    secret: str = made.json()["key"]
    return secret


def assert_not_found(answer: httpx2.Response) -> None:
    """A 404 in the OpenAI error shape."""
    assert answer.status_code == 404, answer.text
    error = answer.json()["error"]
    assert error["type"] == "not_found_error" and error["code"] == "unknown_path"


@pytest.mark.parametrize("workers", [1, 2])
def test_the_admin_api_is_served_on_its_own_port_and_only_there(tmp_path, workers):
    with serving(tmp_path, workers) as (proc, admin_port):
        admin_url = url(admin_port)
        secret = make_key(admin_url)
        # the key made there is served on the gateway's port (every worker within 1 s)
        wait_for(lambda: all(chat(proc.url, secret).status_code == 200 for _ in range(4)), "key")
        listed = get(admin_url, "/admin/v1/keys", ADMIN)
        assert listed.status_code == 200 and len(listed.json()["data"]) == 1
        assert get(admin_url, "/admin/v1/openapi.json").json()["openapi"].startswith("3.")
        assert get(admin_url, "/healthz").status_code == 200
        assert get(admin_url, "/readyz").json()["status"] == "ready"
        refused = get(admin_url, "/admin/v1/keys", bearer("wrong-" + "x" * 40))
        assert refused.status_code == 401 and code(refused) == "invalid_api_key"
        if workers > 1:  # each worker listens on the admin socket the supervisor passed down
            workers_pids = children(proc.proc.pid)
            assert len(workers_pids) == workers
            assert all(listening_on(pid, admin_port) for pid in workers_pids)
        # the gateway's port: no admin API at all, whatever the credential (fail closed)
        for path in ("/admin/v1/keys", "/admin/v1/openapi.json", "/admin/v1/spend"):
            assert_not_found(get(proc.url, path, ADMIN))
        with httpx2.Client(timeout=5) as client:
            posted = client.post(f"{proc.url}/admin/v1/keys", json={"tenant": "x"}, headers=ADMIN)
        assert_not_found(posted)
        me = get(proc.url, "/_gateway/api/me", bearer(secret))  # a key holder's: stays there
        assert me.status_code == 200 and me.json()["tenant"] == "t"
        # the admin port: nothing but the admin API and health
        assert_not_found(chat(admin_url, secret))
        for path in ("/v1/models", "/metrics", "/_gateway/", "/_gateway/api/me", "/mcp", "/"):
            assert_not_found(get(admin_url, path, bearer(secret)))
        upgrade = {"connection": "upgrade", "upgrade": "websocket", "sec-websocket-version": "13"}
        upgrade["sec-websocket-key"] = "dGhlIHNhbXBsZSBub25jZQ=="
        assert_not_found(get(admin_url, "/v1/realtime?model=gpt-4o", {**upgrade, **ADMIN}))
        out = proc.stop()
    assert proc.proc.returncode == 0, out
    lines = out.splitlines()
    serving_at = next(i for i, line in enumerate(lines) if "gateway: serving on" in line)
    assert lines[serving_at + 2].endswith(
        f"gateway: admin API on http://127.0.0.1:{admin_port}/admin/v1/ ([admin] listen; "
        "not served on the gateway's port)"
    )
    assert ADMIN_KEY not in out and secret not in out


def test_an_ipv6_admin_listener(tmp_path):
    with serving(tmp_path, host="::1") as (proc, admin_port):
        wait_for(lambda: _connects(socket.AF_INET6, "::1", admin_port), "the admin port")
        base = f"http://[::1]:{admin_port}"
        assert get(base, "/admin/v1/keys", ADMIN).status_code == 200
        assert_not_found(get(base, "/v1/models"))
        assert_not_found(get(proc.url, "/admin/v1/keys", ADMIN))
        out = proc.stop()
    assert f"gateway: admin API on http://[::1]:{admin_port}/admin/v1/" in out


def test_the_admin_listener_speaks_what_the_gateway_s_port_speaks(tmp_path):
    """With ``[server.tls]`` (ALPN h2): the admin API over TLS and HTTP/2 on its port, with the
    gateway's certificate; still a 404 on the gateway's port."""
    certs = make_certs(tmp_path / "certs")
    with serving(tmp_path, extra=certs.toml()) as (proc, admin_port):
        with http2_client(certs, timeout=5) as client:
            listed = client.get(f"https://127.0.0.1:{admin_port}/admin/v1/keys", headers=ADMIN)
            assert listed.status_code == 200 and listed.http_version == "HTTP/2"
            models = client.get(f"https://127.0.0.1:{admin_port}/v1/models", headers=ADMIN)
            assert_not_found(models)
            assert_not_found(client.get(f"https://127.0.0.1:{proc.port}/admin/v1/keys"))
        out = proc.stop()
    assert f"gateway: admin API on https://127.0.0.1:{admin_port}/admin/v1/" in out


def listening_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the listening socket of 127.0.0.1:``port``."""
    inodes = set()
    with open("/proc/net/tcp") as table:
        for line in list(table)[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    held = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            held.add(os.readlink(fd))
    return bool(inodes & held)


def _connects(family: int, host: str, port: int) -> bool:
    with socket.socket(family) as sock:
        return sock.connect_ex((host, port)) == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_an_admin_port_in_use_is_one_line_and_exit_3(tmp_path, workers):
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        admin_port = taken.getsockname()[1]
        path = write_config(tmp_path, port, f"127.0.0.1:{admin_port}", workers)
        out = subprocess.run(
            gateway_cli("serve", "-c", str(path)), capture_output=True, text=True, timeout=60
        )
    assert out.returncode == STARTUP_FAILURE, out
    (line,) = out.stderr.splitlines()
    assert line.endswith(
        f" ERROR gateway: gateway: cannot listen on 127.0.0.1:{admin_port} ([admin] listen): "
        "address already in use"
    )
    with socket.socket() as again:  # the gateway's own port was let go
        again.bind(("127.0.0.1", port))


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_drains_both_listeners(tmp_path, mock_upstream, workers):
    """A stream on the gateway's port and an admin request whose body is half sent, both in
    flight at SIGTERM: both ports stop accepting, both answers finish whole, exit 0."""
    with serving(tmp_path, workers, backend=mock_upstream.url + "/v1") as (proc, admin_port):
        secret = make_key(url(admin_port))
        wait_for(lambda: all(chat(proc.url, secret).status_code == 200 for _ in range(4)), "key")
        stream = openai_client(proc.url + "/v1", api_key=secret).chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_headers={"x-mock-tokens-per-s": "20", "x-mock-output-tokens": "30"},
        )
        chunks = iter(stream)
        first = next(chunks)
        body = orjson.dumps({"tenant": "late"})
        admin_conn = socket.create_connection(("127.0.0.1", admin_port), timeout=30)
        admin_conn.sendall(
            b"POST /admin/v1/keys HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {ADMIN_KEY}\r\ncontent-length: {len(body)}\r\n".encode()
            + b"expect: 100-continue\r\n\r\n"
        )
        # the gateway asks for the body: the request is read and its app is running
        assert admin_conn.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        admin_conn.sendall(body[:5])
        os.kill(proc.proc.pid, signal.SIGTERM)
        for port in (proc.port, admin_port):
            wait_for(lambda p=port: not _connects(socket.AF_INET, "127.0.0.1", p), f"{port}")
        admin_conn.sendall(body[5:])
        status, headers, answered = _until_closed(admin_conn)
        assert status == 201 and headers.get("connection") == "close"
        assert orjson.loads(answered)["tenant"] == "late"
        rest = list(chunks)
        assert first.choices and rest[-1].choices[0].finish_reason == "stop"
        assert proc.proc.wait(30) == 0
        out = proc.stop()
    assert "cancelling" not in out, out


def _until_closed(conn: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """An answer read until the gateway closes the connection: status, headers, body."""
    data = b""
    with conn:
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, headers = parse_head(head)
    return status, headers, body[: int(headers["content-length"])]


def test_a_reload_keeps_the_listener_where_it_is(tmp_path):
    """SIGHUP with a changed ``[admin] listen``: the rest applies (a key added to the file is
    served), the admin API stays on its port, the new one is never bound, and a warning names
    the setting."""
    with serving(tmp_path) as (proc, admin_port):
        path = tmp_path / f"gateway-{proc.port}.toml"
        moved = free_port()
        text = path.read_text().replace(f"127.0.0.1:{admin_port}", f"127.0.0.1:{moved}")
        digest = "ab" * 32
        path.write_text(text + f'\n[[auth.keys]]\ntenant = "late"\nsha256 = "{digest}"\n')
        os.kill(proc.proc.pid, signal.SIGHUP)

        def listed() -> int:
            return len(get(url(admin_port), "/admin/v1/keys", ADMIN).json()["data"])

        wait_for(lambda: listed() == 1, "the reload")  # the config's new key, on the old port
        assert not _connects(socket.AF_INET, "127.0.0.1", moved)
        assert_not_found(get(proc.url, "/admin/v1/keys", ADMIN))
        out = proc.stop()
    warning = next(line for line in out.splitlines() if "only apply at a restart" in line)
    assert "admin.listen" in warning


@pytest.mark.parametrize(
    ("listen", "problem"),
    [
        ("9090", "must be"),
        ("localhost", "must be"),
        ("127.0.0.1:", "must be"),
        (":9090", "must be"),
        ("127.0.0.1:0", "must be"),
        ("127.0.0.1:65536", "must be"),
        ("::1:9090", "must be"),  # an IPv6 address without its brackets
        ("[127.0.0.1]:9090", "must be"),
        ("[::1]", "must be"),
        ("127.0.0.1:8080", "must not be the gateway's own port"),
    ],
)
def test_config_checks_of_the_listen_address(listen, problem):
    with pytest.raises(ConfigError) as caught:
        gateway_config(admin_toml(admin_extra=f'listen = "{listen}"'))
    (error,) = caught.value.errors
    assert error.startswith("admin.listen: ") and problem in error


@pytest.mark.parametrize(
    ("listen", "address"),
    [
        ("127.0.0.1:9090", ("127.0.0.1", 9090)),
        ("[::1]:9090", ("::1", 9090)),
        ("localhost:9091", ("localhost", 9091)),
        ("0.0.0.0:9092", ("0.0.0.0", 9092)),
    ],
)
def test_listen_addresses_that_are_taken(listen, address):
    config = gateway_config(admin_toml(admin_extra=f'listen = "{listen}"'))
    assert config.admin.address() == address


def test_a_listener_for_an_admin_api_that_is_off_is_refused():
    keys = '[[auth.keys]]\ntenant = "t"\nsha256 = "' + "ab" * 32 + '"\n'
    off = admin_toml(keys, 'listen = "127.0.0.1:9090"\nstore = "off"')
    with pytest.raises(ConfigError, match=r"admin\.listen: the admin API is off"):
        gateway_config(off)
    no_key = off.replace('store = "off"', "").replace("key_env", "# key_env")
    with pytest.raises(ConfigError, match=r"admin\.listen: the admin API is off"):
        gateway_config(no_key)
