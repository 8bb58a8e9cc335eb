"""Everything before the upgrade (docs/spec.md §19): auth, credentials never upstream,
subprotocol negotiation, routing by model, handshake retries and fallback, refusals as HTTP."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.realtime.test_session import sdk_turn
from tests.realtime_support import BACKEND_KEY
from tests.support import config_for, free_port, gateway_config

CLIENT_KEY = "sk-client-realtime-key"


def ws_url(gw: Any, model: str = "gpt-realtime", path: str = "/v1/realtime") -> str:
    return f"ws://127.0.0.1:{gw.port}{path}?model={model}"


def keyed(url: str, *, rpm: int | None = None, models: str = '["*"]', extra: str = "") -> Any:
    digest = hashlib.sha256(CLIENT_KEY.encode()).hexdigest()
    limit = f"rpm = {rpm}" if rpm else ""
    return config_for(
        url,
        extra=f"""
[auth]
mode = "keys"
[[auth.keys]]
tenant = "team-a"
sha256 = "{digest}"
models = {models}
{limit}
{extra}
""",
    )


async def refused(url: str, **kw: Any) -> tuple[int, dict[str, Any], Any]:
    """The HTTP answer to a handshake the gateway refuses: status, JSON body, headers."""
    with pytest.raises(InvalidStatus) as info:
        async with connect(url, open_timeout=10, **kw):
            pass
    resp = info.value.response
    return resp.status_code, orjson.loads(resp.body or b"{}"), resp.headers


def run(coro: Any, timeout: float = 20) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_credentials_never_go_upstream_header_nor_subprotocol(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(keyed(up.url))

    async def main() -> None:
        # the SDK: Authorization: Bearer
        await sdk_turn(gw.base_url, "gpt-realtime", api_key=CLIENT_KEY)
        # a browser: the key in the subprotocol list, beside the ones the upstream may choose
        offered = ["realtime", f"openai-insecure-api-key.{CLIENT_KEY}", "openai-beta.realtime-v1"]
        async with connect(ws_url(gw), subprotocols=offered, open_timeout=10) as ws:
            assert ws.subprotocol == "realtime"
            await ws.recv()  # session.created

    run(main())
    first, second = up.wait_ended(2)
    for seen in (first, second):
        raw = repr(seen.headers) + repr(seen.offered) + seen.path
        assert CLIENT_KEY not in raw
        assert seen.header("authorization") == f"Bearer {BACKEND_KEY}"
        assert seen.header("x-request-id")
    # the other subprotocols were offered upstream, without the one carrying the key
    assert second.offered == ["realtime", "openai-beta.realtime-v1"]


def test_the_client_gets_the_subprotocol_the_upstream_selected(gateway, realtime_upstream):
    up = realtime_upstream(select="openai-beta.realtime-v1")
    gw = gateway(config_for(up.url))

    async def main() -> tuple[str | None, str | None]:
        async with connect(
            ws_url(gw), subprotocols=["realtime", "openai-beta.realtime-v1"], open_timeout=10
        ) as ws:
            chosen = ws.subprotocol
        async with connect(ws_url(gw), open_timeout=10) as ws:  # none offered: none chosen
            return chosen, ws.subprotocol

    assert run(main()) == ("openai-beta.realtime-v1", None)


def test_refusals_before_the_upgrade_are_http_answers_in_the_openai_shape(
    gateway, realtime_upstream
):
    up = realtime_upstream()
    gw = gateway(keyed(up.url, models='["gpt-realtime*"]'))
    auth = {"Authorization": f"Bearer {CLIENT_KEY}"}

    async def main() -> list[tuple[int, dict[str, Any], Any]]:
        return [
            await refused(ws_url(gw)),  # no key
            await refused(ws_url(gw), additional_headers={"Authorization": "Bearer sk-wrong"}),
            await refused(ws_url(gw, "other-model"), additional_headers=auth),  # not allowed
            await refused(ws_url(gw, "")[: -len("?model=")], additional_headers=auth),
        ]

    answers = run(main())
    assert [a[0] for a in answers] == [401, 401, 403, 400]
    assert [a[1]["error"]["type"] for a in answers] == [
        "authentication_error",
        "authentication_error",
        "permission_error",
        "invalid_request_error",
    ]
    assert all(set(a[1]["error"]) == {"message", "type", "code", "param"} for a in answers)
    assert up.handshakes == []  # nothing refused went upstream


def test_rpm_counts_a_session_start(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(keyed(up.url, rpm=2))
    auth = {"Authorization": f"Bearer {CLIENT_KEY}"}

    # the third start within the minute is refused with 429 and OpenAI's rate-limit headers
    async def sessions() -> tuple[int, dict[str, Any], Any]:
        for _ in range(2):
            async with connect(ws_url(gw), additional_headers=auth, open_timeout=10) as ws:
                await ws.recv()
        return await refused(ws_url(gw), additional_headers=auth)

    status, body, headers = run(sessions())
    assert status == 429 and body["error"]["type"] == "rate_limit_error"
    assert headers.get("retry-after") and headers.get("x-ratelimit-limit-requests") == "2"


def test_no_route_is_404_and_routes_choose_the_backend_by_model(gateway, realtime_upstream):
    a, b = realtime_upstream(), realtime_upstream()
    gw = gateway(
        gateway_config(f"""
[[backends]]
name = "a"
url = "{a.url}"
[[backends]]
name = "b"
url = "{b.url}"
[[routes]]
models = ["gpt-realtime*"]
backends = ["a"]
[[routes]]
models = ["mini-*"]
backends = ["b"]
""")
    )

    async def main() -> tuple[int, dict[str, Any], Any]:
        for model in ("gpt-realtime-1", "mini-voice", "gpt-realtime-2"):
            async with connect(ws_url(gw, model), open_timeout=10) as ws:
                await ws.recv()
        return await refused(ws_url(gw, "unrouted"))

    status, body, _ = run(main())
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert [s.model for s in a.handshakes] == ["gpt-realtime-1", "gpt-realtime-2"]
    assert [s.model for s in b.handshakes] == ["mini-voice"]


def two_backends(first: str, second: str, route_extra: str = "", backend_extra: str = "") -> Any:
    return gateway_config(f"""
[[backends]]
name = "first"
url = "{first}"
{backend_extra}
[[backends]]
name = "second"
url = "{second}"
[[routes]]
models = ["*"]
backends = ["first", "second"]
{route_extra}
""")


def test_a_failed_handshake_falls_back_to_the_next_backend(gateway, realtime_upstream):
    good = realtime_upstream()
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: connection refused
    gw = gateway(two_backends(dead, good.url, "retries = 1"))

    async def main() -> str:
        async with connect(ws_url(gw), open_timeout=10) as ws:
            return str(await ws.recv())

    assert "session.created" in run(main())
    assert len(good.handshakes) == 1


def test_a_retryable_status_is_retried_then_falls_back(gateway, realtime_upstream):
    busy, good = realtime_upstream(), realtime_upstream()
    gw = gateway(two_backends(busy.url, good.url, "retries = 1"))
    # the first backend answers 503 to this model: tried twice (a retry), then the second
    url = ws_url(gw, "refuse-503")

    async def main() -> int:
        try:
            async with connect(url, open_timeout=10) as ws:
                await ws.recv()
        except InvalidStatus as exc:  # the good upstream refuses that model too
            return exc.response.status_code
        return 101

    assert run(main()) == 503  # the upstream's own status and body pass through
    assert len(busy.handshakes) == 2 and len(good.handshakes) == 2


def test_a_retry_after_beyond_the_cap_moves_to_the_next_backend_at_once(gateway, realtime_upstream):
    """The attempt loop's rule for every call upstream (docs/spec.md §13): more patience asked
    than the cap gives the backend up for this session (no retry there, however many the route
    allows); on the last backend the answer is what the client gets."""
    first, second = realtime_upstream(), realtime_upstream()
    gw = gateway(two_backends(first.url, second.url, "retries = 2"))
    status, body, _ = run(refused(ws_url(gw, "refuse-429-after-60")))
    assert status == 429 and body["error"]["code"] == "refused_429"
    assert len(first.handshakes) == 1 and len(second.handshakes) == 1


def test_a_refusal_with_two_retry_after_headers_is_read_by_its_first(gateway, realtime_upstream):
    """A hostile or broken upstream repeats ``Retry-After``: the first one counts, as for a
    model call's answer, and the refusal still reaches the client as HTTP."""
    up = realtime_upstream()
    gw = gateway(config_for(up.url, route_extra="retries = 1"))
    status, body, _ = run(refused(ws_url(gw, "refuse-503-after-0-after-60")))
    assert status == 503 and body["error"]["code"] == "refused_503"
    assert len(up.handshakes) == 2  # the first hint (0 s) allowed the retry


def test_a_redirect_is_refused_never_followed_nor_retried(gateway, realtime_upstream):
    """Redirects are never followed (docs/spec.md §13), on a WebSocket handshake as on a model
    call: 502 ``upstream_redirect``, and no other attempt."""
    first, second = realtime_upstream(), realtime_upstream()
    gw = gateway(two_backends(first.url, second.url, "retries = 1"))
    status, body, _ = run(refused(ws_url(gw, "refuse-307")))
    assert status == 502 and body["error"]["code"] == "upstream_redirect"
    assert len(first.handshakes) == 1 and second.handshakes == []


def test_every_attempt_failing_is_502_never_an_accepted_socket(gateway):
    dead = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]
    gw = gateway(two_backends(*dead, "retries = 1"))
    status, body, headers = run(refused(ws_url(gw)))
    assert status == 502
    assert body["error"]["type"] == "upstream_error"
    assert headers.get("x-should-retry") == "true"


def test_an_upstream_that_never_answers_the_handshake_is_504(gateway):
    """A black hole: the TCP connection is accepted, the handshake never answered."""
    import socket

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)
    url = f"http://127.0.0.1:{hole.getsockname()[1]}/v1"
    try:
        gw = gateway(
            config_for(url, backend_extra="read_timeout_s = 0.3", route_extra="retries = 0")
        )
        status, body, _ = run(refused(ws_url(gw)))
    finally:
        hole.close()
    assert status == 504 and body["error"]["type"] == "upstream_timeout"


def test_an_upgrade_on_any_other_path_is_426_before_any_upgrade(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(config_for(up.url))
    for path in ("/v1/responses", "/v1/chat/completions", "/"):
        status, body, _ = run(refused(ws_url(gw, path=path)))
        assert status == 426, path
        assert body["error"]["code"] == "upgrade_not_supported"
    assert up.handshakes == []


def test_realtime_disabled_is_404(gateway, realtime_upstream):
    up = realtime_upstream()
    gw = gateway(config_for(up.url, extra="[realtime]\nenabled = false"))
    status, body, _ = run(refused(ws_url(gw)))
    assert status == 404 and body["error"]["code"] == "realtime_disabled"
