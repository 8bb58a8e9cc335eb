"""The browser Origin policy and CORS (docs/spec.md §25, gateway/origins.py) over real sockets:
what a web page on another site can make a browser send — a form's content types, a
``no-cors`` fetch, a preflight — refused before anything reaches the upstream; the allowed
origins get CORS and nothing more. (Realtime upgrades: tests/realtime/test_origins.py.)"""

from __future__ import annotations

from collections.abc import Callable

import httpx2
import pytest

from gateway.config import ConfigError
from tests.support import GatewayServer, ScriptedUpstream, gateway_config, http_response
from tests.test_security import BODY, CHAT, config, send_raw, status

FOREIGN = ["https://evil.example", "http://127.0.0.1.evil.example:8080", "null", "nonsense"]
#: what a browser form (or a fetch without preflight) may send
SIMPLE_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"]


@pytest.fixture
def up(upstream) -> ScriptedUpstream:
    async def grant_everything(req, writer) -> bool:  # an upstream that grants CORS to anyone
        writer.write(http_response(200, CHAT, extra=[("access-control-allow-origin", "*")]))
        return True

    return upstream(grant_everything)


@pytest.fixture
def gw_with(gateway, up) -> Callable[[str], GatewayServer]:
    def start(extra: str = "") -> GatewayServer:
        return gateway(gateway_config(config(f"http://127.0.0.1:{up.port}/base/v1", extra=extra)))

    return start


def chat(gw: GatewayServer, headers: dict[str, str]) -> httpx2.Response:
    with httpx2.Client(timeout=10) as http:
        return http.post(gw.url + "/v1/chat/completions", content=BODY, headers=headers)


@pytest.mark.parametrize("origin", FOREIGN)
@pytest.mark.parametrize("ctype", SIMPLE_TYPES)
def test_a_cross_site_simple_post_is_refused(gw_with, up, origin, ctype):
    r = chat(gw_with(), {"origin": origin, "content-type": ctype})
    assert r.status_code == 403
    assert r.json()["error"] == {
        "message": r.json()["error"]["message"],
        "type": "permission_error",
        "code": "origin_not_allowed",
        "param": None,
    }
    assert "access-control-allow-origin" not in r.headers
    assert up.requests == []


def test_no_origin_is_not_a_browser_and_passes_without_cors(gw_with, up):
    r = chat(gw_with(), {"content-type": "text/plain"})
    assert r.status_code == 200
    # the upstream's own grant never reaches the client: CORS is the gateway's to give
    assert "access-control-allow-origin" not in r.headers
    assert len(up.requests) == 1


@pytest.mark.parametrize(
    "origin", ["http://localhost:5173", "http://127.0.0.1:3000", "https://[::1]:8443"]
)
def test_a_loopback_origin_is_served_with_cors(gw_with, up, origin):
    r = chat(gw_with(), {"origin": origin, "content-type": "application/json"})
    assert r.status_code == 200
    assert r.headers.get_list("access-control-allow-origin") == [origin]
    assert "Origin" in r.headers.get("vary", "")
    assert len(up.requests) == 1


def test_a_configured_origin_is_served_and_star_allows_all(gw_with, up):
    gw = gw_with('[server]\nallowed_origins = ["https://app.example", "http://dev.example:*"]')
    for origin in ("https://app.example", "https://app.example:443", "http://dev.example:81"):
        assert chat(gw, {"origin": origin}).status_code == 200
    assert chat(gw, {"origin": "https://other.example"}).status_code == 403
    everyone = gw_with('[server]\nallowed_origins = ["*"]')
    r = chat(everyone, {"origin": "https://evil.example", "content-type": "text/plain"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://evil.example"


def preflight(gw: GatewayServer, origin: str) -> httpx2.Response:
    with httpx2.Client(timeout=10) as http:
        return http.request(
            "OPTIONS",
            gw.url + "/v1/chat/completions",
            headers={
                "origin": origin,
                "access-control-request-method": "POST",
                "access-control-request-headers": "authorization, content-type",
            },
        )


def test_a_preflight_is_granted_only_to_an_allowed_origin(gw_with, up):
    gw = gw_with()
    ok = preflight(gw, "http://localhost:5173")
    assert ok.status_code == 204
    assert ok.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert "POST" in ok.headers["access-control-allow-methods"]
    assert ok.headers["access-control-allow-headers"] == "authorization, content-type"
    assert "access-control-allow-credentials" not in ok.headers
    refused = preflight(gw, "https://evil.example")
    assert refused.status_code == 403
    assert not any(name.startswith("access-control-") for name in refused.headers)
    assert up.requests == []  # a preflight is the edge's: never forwarded


def test_two_origins_are_refused(gw_with, up):
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nOrigin: http://localhost:1\r\n"
        b"Origin: https://evil.example\r\nContent-Length: %d\r\n\r\n" % len(BODY)
    )
    assert status(send_raw(gw_with(), head + BODY)) == 403
    assert up.requests == []


def test_the_live_views_sign_in_and_out_are_not_usable_cross_site(gw_with):
    gw = gw_with()
    with httpx2.Client(timeout=10) as http:
        for method in ("POST", "DELETE"):
            url = gw.url + "/_gateway/api/session"
            r = http.request(method, url, headers={"origin": "https://evil.example"})
            assert r.status_code == 403 and "set-cookie" not in r.headers
            r = http.request(method, url, headers={"origin": gw.url})  # its own page
            assert r.status_code == 204
        # the page itself, with or without its "/" (one canonical path), resolves under it
        for path in ("/_gateway/", "/_gateway"):
            page = http.get(gw.url + path)
            assert page.status_code == 200
            assert '<base href="/_gateway/">' in page.text


def test_an_mcp_servers_origins_pass_the_edge_for_mcp_only(gateway, up):
    toml = config(f"http://127.0.0.1:{up.port}/base/v1") + (
        '[[mcp_servers]]\nname = "tools"\nurl = "mock://"\n'
        'allowed_origins = ["https://tools.example"]\n'
    )
    gw = gateway(gateway_config(toml))
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    origin = {"origin": "https://tools.example"}
    with httpx2.Client(timeout=10) as http:
        assert http.post(gw.url + "/mcp/tools", json=ping, headers=origin).status_code == 200
        assert chat(gw, origin).status_code == 403
    assert up.requests == []


@pytest.mark.parametrize("entry", ["app.example", "https://", "ftp//x", "https://a.example/path"])
def test_a_bad_allowed_origins_entry_is_a_config_error(entry):
    with pytest.raises(ConfigError) as err:
        gateway_config(
            config("http://127.0.0.1:1/v1", extra=f'[server]\nallowed_origins = ["{entry}"]')
        )
    assert any(e.startswith("server.allowed_origins") for e in err.value.errors)
