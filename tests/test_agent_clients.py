"""What Claude Code needs from the gateway (docs/spec.md §22), driven by the official
``anthropic`` SDK against upstreams that are separate servers on loopback:

- ``POST /v1/messages/count_tokens`` (Claude Code asks it when to compact; a 404 breaks it),
  routed by model like messages, its own ``gen_ai.operation.name``, not cached, no tokens
  debited or counted;
- the client's ``anthropic-beta`` and ``anthropic-version`` headers reach the anthropic backend;
- ``cache_control`` breakpoints reach it byte for byte, and ``history_window`` leaves a request
  that carries one alone.

The Responses API side (Codex, the Agents SDK) is tests/test_responses_state.py.
"""

from __future__ import annotations

import hashlib
from typing import Any

import anthropic
import httpx2
import orjson
import pytest

from tests.conftest import BACKEND_KEY
from tests.model_api_support import metric_lines, trace_of, traced
from tests.support import SeenRequest, anthropic_client, gateway_config

CLIENT_KEY = "sk-ant-agent-client-key"
MESSAGES: list[Any] = [{"role": "user", "content": "How big is this conversation?"}]


def config(claude_url: str, gpt_url: str, claude_route: str = "", extra: str = "") -> Any:
    """``gpt-*`` first (so the first route's backend, where other paths go, is not claude's),
    then ``claude-*`` on an ``anthropic`` backend."""
    return gateway_config(
        f"""
[[backends]]
name = "gpt"
url = "{gpt_url}"
api_key_env = "TEST_BACKEND_KEY"

[[backends]]
name = "claude"
url = "{claude_url}"
provider = "anthropic"
api_key_env = "TEST_BACKEND_KEY"

[[routes]]
name = "gpt"
models = ["gpt-*"]
backends = ["gpt"]

[[routes]]
name = "claude"
models = ["claude-*"]
backends = ["claude"]
{claude_route}
{extra}
"""
    )


def only(up: Any, path: str) -> list[SeenRequest]:
    return [r for r in up.requests if r.target == path]


# ---------------------------------------------------------------- count_tokens


def test_count_tokens_is_routed_by_model_and_never_cached(gateway, ups):
    claude, gpt = ups
    gw = gateway(config(claude.url, gpt.url))
    c = anthropic_client(gw.url, CLIENT_KEY)
    for _ in range(2):  # deterministic and asked twice: still never a cache hit
        raw = c.messages.with_raw_response.count_tokens(model="claude-sonnet-4", messages=MESSAGES)
        assert raw.parse().input_tokens > 0
        assert raw.headers["x-gateway-cache"] == "BYPASS"
    sent = only(claude, "/v1/messages/count_tokens")
    assert len(sent) == 2 and not gpt.requests
    assert sent[0].header("x-api-key") == BACKEND_KEY
    assert sent[0].header("authorization") is None
    # an unknown model is the gateway's 404, as for messages
    with pytest.raises(anthropic.NotFoundError):
        c.messages.count_tokens(model="nobody-serves-this", messages=MESSAGES)


def test_count_tokens_debits_no_tokens_and_counts_none(gateway, ups):
    claude, gpt = ups
    digest = hashlib.sha256(CLIENT_KEY.encode()).hexdigest()
    keys = f"""
[auth]
mode = "keys"
[[auth.keys]]
tenant = "agents"
sha256 = "{digest}"
tpm = 100
"""
    gw = gateway(config(claude.url, gpt.url, extra=keys))
    c = anthropic_client(gw.url, CLIENT_KEY)
    long = [{"role": "user", "content": "word " * 400}]  # ~400 tokens: 4 minutes of tpm 100
    for _ in range(3):
        assert c.messages.count_tokens(model="claude-sonnet-4", messages=long).input_tokens > 100
    assert not metric_lines(gw.url, "gateway_tokens_total")
    # the debit is live: a real call's usage is debited and the key is then over its budget
    c.messages.create(model="claude-sonnet-4", max_tokens=16, messages=long)
    assert metric_lines(gw.url, "gateway_tokens_total")
    with pytest.raises(anthropic.RateLimitError):
        c.messages.count_tokens(model="claude-sonnet-4", messages=MESSAGES)


def test_count_tokens_has_its_own_operation_name(gateway, ups, receiver):
    claude, gpt = ups
    gw = gateway(config(claude.url, gpt.url, extra=traced(receiver.endpoint)))
    raw = anthropic_client(gw.url, CLIENT_KEY).messages.with_raw_response.count_tokens(
        model="claude-sonnet-4", messages=MESSAGES
    )
    spans = trace_of(receiver, raw.headers, 4)
    span = spans["count_tokens claude-sonnet-4"]
    assert span.kind == "CLIENT"
    assert span.attributes["gen_ai.operation.name"] == "count_tokens"
    assert span.attributes["gen_ai.provider.name"] == "anthropic"
    assert "gen_ai.usage.input_tokens" not in span.attributes  # a count is not usage
    (root,) = (s for s in spans.values() if s.kind == "SERVER")
    assert root.attributes["gateway.route"] == "claude"


# ---------------------------------------------------------------- headers


def test_anthropic_beta_and_version_reach_the_anthropic_backend(gateway, ups):
    claude, gpt = ups
    gw = gateway(config(claude.url, gpt.url))
    sent: list[tuple[str, str]] = []

    def capture(request: httpx2.Request) -> None:
        sent.append(
            (request.headers.get("anthropic-beta", ""), request.headers["anthropic-version"])
        )

    c = anthropic_client(
        gw.url, CLIENT_KEY, http_client=httpx2.Client(event_hooks={"request": [capture]})
    )
    betas = ["prompt-caching-2024-07-31", "token-efficient-tools-2025-02-19"]
    msg = c.beta.messages.create(
        model="claude-sonnet-4", max_tokens=32, messages=MESSAGES, betas=betas
    )
    assert msg.content[0].text
    count = c.beta.messages.count_tokens(model="claude-sonnet-4", messages=MESSAGES, betas=betas)
    assert count.input_tokens > 0
    assert len(claude.requests) == len(sent) == 2
    for req, (beta, version) in zip(claude.requests, sent, strict=True):
        assert req.target.split("?")[0] in ("/v1/messages", "/v1/messages/count_tokens")
        assert req.header("anthropic-beta") == beta  # as the SDK sent it (it adds its own)
        assert beta.startswith(",".join(betas))
        assert req.header("anthropic-version") == version  # the SDK's own, not the default
    # a version the client chose wins over the gateway's default, sent once
    c.messages.create(
        model="claude-sonnet-4",
        max_tokens=8,
        messages=MESSAGES,
        extra_headers={"anthropic-version": "2024-10-22"},
    )
    last = claude.requests[-1]
    assert [v for k, v in last.headers if k.lower() == "anthropic-version"] == ["2024-10-22"]


# ---------------------------------------------------------------- cache_control


def _conversation(marked: bool) -> tuple[list[Any], list[Any]]:
    """Six turns, with a prompt-cache breakpoint on the system prompt and the last user turn
    when ``marked`` (as Claude Code sends them)."""
    cache = {"cache_control": {"type": "ephemeral"}} if marked else {}
    system = [{"type": "text", "text": "You are a coding agent.", **cache}]
    messages: list[Any] = []
    for i in range(3):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"question {i}"}]})
        messages.append({"role": "assistant", "content": f"answer {i}"})
    messages.append(
        {"role": "user", "content": [{"type": "text", "text": "and now?", **cache}]},
    )
    return system, messages


def test_cache_control_reaches_the_upstream_byte_for_byte_and_the_window_is_skipped(gateway, ups):
    claude, gpt = ups
    gw = gateway(config(claude.url, gpt.url, claude_route="history_window = 2"))
    sent: list[bytes] = []

    def capture(request: httpx2.Request) -> None:
        sent.append(request.read())

    c = anthropic_client(
        gw.url, CLIENT_KEY, http_client=httpx2.Client(event_hooks={"request": [capture]})
    )
    system, messages = _conversation(marked=True)
    c.messages.create(model="claude-sonnet-4", max_tokens=16, system=system, messages=messages)
    c.messages.count_tokens(model="claude-sonnet-4", system=system, messages=messages)
    received = only(claude, "/v1/messages") + only(claude, "/v1/messages/count_tokens")
    assert [r.body for r in received] == sent  # the client's bytes, untouched
    assert len(orjson.loads(received[0].body)["messages"]) == 7
    # without a breakpoint the route's window applies (to the count too: it counts what a
    # messages call would send)
    system, messages = _conversation(marked=False)
    c.messages.create(model="claude-sonnet-4", max_tokens=16, system=system, messages=messages)
    c.messages.count_tokens(model="claude-sonnet-4", system=system, messages=messages)
    windowed = only(claude, "/v1/messages")[-1], only(claude, "/v1/messages/count_tokens")[-1]
    for req in windowed:
        assert [m["content"] for m in orjson.loads(req.body)["messages"]] == [
            [{"type": "text", "text": "and now?"}]
        ]
