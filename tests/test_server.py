"""gateway/server/process.py: what ``gateway serve`` says at startup (docs/spec.md §3: "serving
on" only once bound, a port in use as one line and a failed exit, the warning for a key anyone
on the network could spend) and the client guards' states on real connections."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from gateway.server.http1 import Http1Protocol
from gateway.server.http1_guards import Awaiting
from gateway.server.process import STARTUP_FAILURE, exposure_warning
from tests.gateway_process import chat_request, read_answer
from tests.support import GatewayServer, gateway_cli, gateway_config, until

MOCK = """
[[backends]]
name = "mock"
url = "mock://"

[[routes]]
models = ["*"]
backends = ["mock"]
"""
KEYED = """
[[backends]]
name = "paid"
url = "http://127.0.0.1:9/v1"
api_key_env = "TEST_BACKEND_KEY"

[[routes]]
models = ["*"]
backends = ["paid"]
"""


@contextlib.contextmanager
def port_in_use(host: str, listening: bool) -> Iterator[int]:
    """A port taken on ``host``: by a listening socket (another server), or only bound (no
    SO_REUSEADDR, so a bind still fails; nothing on the network can connect to it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        if listening:
            sock.listen(1)
        yield sock.getsockname()[1]


def serve_process(
    tmp_path: Path, host: str, port: int, body: str, workers: int = 1, fmt: str = "json"
) -> list[str]:
    """``gateway serve`` as its own process, expected to end by itself; returns the lines it
    wrote to stderr (nothing goes to stdout: no request was served)."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[server]\nhost = "{host}"\nport = {port}\nworkers = {workers}\n'
        f'[logging]\nlevel = "info"\nformat = "{fmt}"\n{body}'
    )
    out = subprocess.run(
        gateway_cli("serve", "-c", str(config)), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == STARTUP_FAILURE, out
    assert out.stdout == "", out
    assert "serving on" not in out.stderr
    return out.stderr.splitlines()


def gateway_lines(lines: list[str]) -> list[tuple[str, str]]:
    """(level, message) of JSON log lines, each from the ``gateway`` logger."""
    records = [orjson.loads(line) for line in lines]
    assert {r["logger"] for r in records} == {"gateway"}, records
    return [(r["level"], r["msg"]) for r in records]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_port_in_use_is_one_line_naming_the_address_and_a_failed_exit(tmp_path, workers):
    with port_in_use("127.0.0.1", listening=True) as port:
        lines = serve_process(tmp_path, "127.0.0.1", port, MOCK, workers)
    assert gateway_lines(lines) == [
        ("error", f"gateway: cannot listen on 127.0.0.1:{port}: address already in use")
    ]


def test_a_port_in_use_in_text_format(tmp_path):
    with port_in_use("127.0.0.1", listening=True) as port:
        (line,) = serve_process(tmp_path, "127.0.0.1", port, MOCK, fmt="text")
    assert line.endswith(
        f" ERROR gateway: gateway: cannot listen on 127.0.0.1:{port}: address already in use"
    )


def test_beyond_loopback_without_client_keys_a_backend_key_is_a_warning(tmp_path):
    # the port is taken (bound, never listening): the warning comes first, nothing is exposed
    with port_in_use("0.0.0.0", listening=False) as port:
        lines = serve_process(tmp_path, "0.0.0.0", port, KEYED)
    (level, warning), refused = gateway_lines(lines)
    assert level == "warning"
    assert warning.startswith('gateway: warning: listening on 0.0.0.0 with [auth] mode = "off"')
    assert "backend paid sends its own key" in warning and '[auth] mode = "keys"' in warning
    assert refused == ("error", f"gateway: cannot listen on 0.0.0.0:{port}: address already in use")


KEYS = '[auth]\nmode = "keys"\n[[auth.keys]]\ntenant = "t"\nsha256 = "' + "0" * 64 + '"\n'


@pytest.mark.parametrize(
    ("host", "extra", "key_env", "warns"),
    [
        ("0.0.0.0", "", True, True),
        ("::", "", True, True),
        ("10.1.2.3", "", True, True),
        ("127.0.0.1", "", True, False),
        ("::1", "", True, False),
        ("localhost", "", True, False),
        ("0.0.0.0", KEYS, True, False),  # clients need a key of their own
        ("0.0.0.0", "", False, False),  # no key of ours to spend
    ],
)
def test_exposure_warning_table(host: str, extra: str, key_env: bool, warns: bool):
    key = 'api_key_env = "TEST_BACKEND_KEY"' if key_env else ""
    config = gateway_config(
        f'[server]\nhost = "{host}"\n{extra}\n'
        f'[[backends]]\nname = "b"\nurl = "http://127.0.0.1:9/v1"\n{key}\n'
        '[[routes]]\nmodels = ["*"]\nbackends = ["b"]\n'
    )
    assert (exposure_warning(config) is not None) is warns


# ---------------------------------------------------------------- the client guards' states


def connection_of(gw: GatewayServer, port: int) -> Http1Protocol:
    """The server's protocol object for the client connection from local ``port``."""
    for proto in gw.server.state.connections:
        if isinstance(proto, Http1Protocol) and proto.client == ("127.0.0.1", port):
            return proto
    raise AssertionError(f"no connection from port {port}")


def test_the_guards_follow_what_the_client_owes(gateway):
    gw = gateway(
        gateway_config(
            MOCK + "[server]\nclient_header_timeout_s = 0.5\nclient_body_timeout_s = 1\n"
        )
    )

    async def scenario() -> None:
        request = chat_request(gw.port, stream=False)
        head, body = request.split(b"\r\n\r\n", 1)
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        local = writer.get_extra_info("sockname")[1]
        await until(lambda: any(True for _ in gw.server.state.connections), "accepted")
        proto = connection_of(gw, local)
        assert proto.awaiting is Awaiting.HEAD  # from the accept
        writer.write(head + b"\r\n\r\n" + body[:5])
        await until(lambda: proto.awaiting is Awaiting.BODY, "the head is in")
        writer.write(body[5:])
        answer = await asyncio.wait_for(read_answer(reader), 10)
        assert answer.status == 200 and proto.awaiting is Awaiting.NOTHING
        # between requests nothing is owed: a pause longer than the header timeout is no 408
        await asyncio.sleep(0.8)
        writer.write(request)
        assert (await asyncio.wait_for(read_answer(reader), 10)).status == 200
        # a kept-alive connection's next head is due from its first byte
        writer.write(head[:10])
        await until(lambda: proto.awaiting is Awaiting.HEAD, "a head began")
        refused = await asyncio.wait_for(read_answer(reader), 10)
        assert refused.status == 408
        assert orjson.loads(refused.body)["error"]["code"] == "client_header_timeout"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # and closed
        assert proto.awaiting is Awaiting.NOTHING
        writer.close()

    asyncio.run(scenario())
