"""The router hop driven directly: parse once, validate, first matching route, policies."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.config import BackendConfig, EdgeConfig, RouteConfig
from gateway.context import RequestContext
from gateway.errors import InvalidRequest, NotFound
from gateway.hops.edge import RequestEdge
from gateway.hops.router import Router
from gateway.routes import Backend, Route
from gateway.transports.mock_impl import MockTransport

MOCK = BackendConfig(name="mock", url="mock://")
BACKEND = Backend(MOCK, MockTransport(MOCK), environ={})


def router(*routes: RouteConfig) -> Router:
    return Router(tuple(Route(r, (BACKEND,)) for r in routes))


def route_cfg(name: str, models: tuple[str, ...], **policies: Any) -> RouteConfig:
    return RouteConfig(name=name, models=models, backends=("mock",), **policies)


def context(path: str = "/v1/chat/completions") -> RequestContext:
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 1),
    }
    return RequestEdge(EdgeConfig()).accept(scope)


CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


def test_first_matching_route_wins_and_globs_are_case_sensitive():
    r = router(
        route_cfg("exact", ("gpt-4o",)),
        route_cfg("family", ("gpt-4o*", "o3*")),
        route_cfg("rest", ("*",)),
    )
    assert r.match("gpt-4o").name == "exact"
    assert r.match("gpt-4o-mini").name == "family"
    assert r.match("o3-pro").name == "family"
    assert r.match("GPT-4O").name == "rest"
    ctx = context()
    call = r.route(ctx, orjson.dumps({**CHAT, "model": "gpt-4o-mini", "stream": True}))
    assert (call.route.name, call.operation, call.stream, ctx.model) == (
        "family",
        "chat",
        True,
        "gpt-4o-mini",
    )
    assert ctx.call is call and ctx.timeline.routed is not None


def test_no_route_is_404_with_the_model_known():
    r = router(route_cfg("gpt", ("gpt-*",)))
    ctx = context()
    with pytest.raises(NotFound) as info:
        r.route(ctx, orjson.dumps({**CHAT, "model": "claude-3"}))
    assert info.value.code == "model_not_found" and ctx.model == "claude-3" and ctx.call is None


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        ("/v1/chat/completions", b"{not json", "invalid_json"),
        ("/v1/chat/completions", b"[1, 2]", "invalid_body"),
        ("/v1/chat/completions", b'{"messages": []}', "invalid_model"),
        ("/v1/chat/completions", b'{"model": "m", "messages": []}', "invalid_messages"),
        (
            "/v1/chat/completions",
            b'{"model": "m", "messages": [{"content": 1}]}',
            "invalid_messages",
        ),
        (
            "/v1/chat/completions",
            b'{"model": "m", "messages": [{"role": "u"}], "n": 0}',
            "invalid_value",
        ),
        (
            "/v1/chat/completions",
            b'{"model": "m", "messages": [{"role": "u"}], "stream": 1}',
            "invalid_type",
        ),
        ("/v1/completions", b'{"model": "m", "prompt": 3}', "invalid_prompt"),
        ("/v1/embeddings", b'{"model": "m", "input": ""}', "invalid_input"),
    ],
)
def test_bad_bodies_are_400_with_a_code(path: str, body: bytes, code: str):
    with pytest.raises(InvalidRequest) as info:
        router(route_cfg("all", ("*",))).route(context(path), body)
    assert info.value.code == code and info.value.status == 400


def test_body_is_forwarded_byte_for_byte_without_policies():
    body = b'{ "model" : "gpt-4o",  "messages": [{"role": "user", "content": "hi"}] }'
    call = router(route_cfg("all", ("*",))).route(context(), body)
    assert call.body is body and not call.policies


def test_max_tokens_cap_clamps_and_sets_when_absent():
    r = router(route_cfg("capped", ("*",), max_tokens_cap=100))
    call = r.route(context(), orjson.dumps({**CHAT, "max_tokens": 500}))
    assert orjson.loads(call.body)["max_tokens"] == 100
    assert call.policies == {"policy.max_tokens": "500->100"}
    call = r.route(context(), orjson.dumps({**CHAT, "max_completion_tokens": 50}))
    assert orjson.loads(call.body)["max_completion_tokens"] == 50 and not call.policies
    call = r.route(context(), orjson.dumps(CHAT))
    assert orjson.loads(call.body)["max_tokens"] == 100
    assert call.policies == {"policy.max_tokens": "unset->100"}


@pytest.mark.parametrize(
    ("url", "field", "sets"),
    [
        # OpenAI's reasoning models (o1/o3/o4) reject max_tokens: its hosts take the other one
        ("https://api.openai.com/v1", None, "max_completion_tokens"),
        ("https://acme.openai.azure.com/openai/v1", None, "max_completion_tokens"),
        ("http://127.0.0.1:8000/v1", None, "max_tokens"),
        ("http://127.0.0.1:8000/v1", "max_completion_tokens", "max_completion_tokens"),
        ("https://api.openai.com/v1", "max_tokens", "max_tokens"),
    ],
)
def test_a_missing_limit_is_set_in_the_field_the_backend_takes(url, field, sets):
    cfg = BackendConfig(name="b", url=url, max_tokens_field=field)
    backend = Backend(cfg, MockTransport(MOCK), environ={})
    r = Router((Route(route_cfg("o", ("o3*",), max_tokens_cap=100), (backend,)),))
    body = orjson.loads(r.route(context(), orjson.dumps({**CHAT, "model": "o3-mini"})).body)
    other = ({"max_tokens", "max_completion_tokens"} - {sets}).pop()
    assert body[sets] == 100 and other not in body
    # a limit the client sent is clamped where it is, whatever the backend's field
    sent = orjson.dumps({**CHAT, "model": "o3-mini", other: 500})
    body = orjson.loads(r.route(context(), sent).body)
    assert body[other] == 100 and sets not in body


def test_history_window_keeps_system_and_the_last_n_and_no_orphan_tool_result():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "1"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t"}]},
        {"role": "tool", "tool_call_id": "t", "content": "42"},
        {"role": "user", "content": "2"},
    ]
    r = router(route_cfg("windowed", ("*",), history_window=2))
    call = r.route(context(), orjson.dumps({"model": "m", "messages": messages}))
    kept = orjson.loads(call.body)["messages"]
    # the last two others are [tool, user]: the tool result lost its assistant turn, so it goes
    assert kept == [messages[0], messages[4]]
    assert call.policies == {"policy.history_window": "5->2"}


def test_embeddings_are_never_capped_or_windowed():
    r = router(route_cfg("capped", ("*",), max_tokens_cap=10, history_window=1))
    body = orjson.dumps({"model": "e", "input": ["a", "b"]})
    call = r.route(context("/v1/embeddings"), body)
    assert call.body is body and call.operation == "embeddings" and not call.policies


def test_the_model_memo_is_bounded():
    r = router(route_cfg("all", ("*",)))
    for i in range(10_050):
        r.match(f"model-{i}")
    assert len(r._by_model) <= 10_000
