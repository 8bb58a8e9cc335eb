"""Nothing unbilled (docs/spec.md §20): a priced chat stream asks its upstream for
usage when the client did not, the usage chunk stays out of what that client receives, and a
stream the client cut before its usage arrived is charged from what was relayed.

Real parts: the gateway as a server on loopback, the openai SDK as the client, an upstream that
reports the figures the test chooses (tests/spend_support.py) or, for the cut stream, a scripted
one that sends a known number of content events and then holds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import orjson
import pytest

from tests.spend_support import (
    CLAUDE,
    GPT,
    PRICES,
    AccessLines,
    Figures,
    UsageUpstream,
    cost,
    sample,
)
from tests.support import (
    LAST_CHUNK,
    GatewayServer,
    ScriptedUpstream,
    SeenRequest,
    anthropic_client,
    chat_chunk,
    chunk,
    gateway_config,
    sse_head,
)
from tests.test_spend import CHEAP, KEY_A, KEY_TPM, MSG, keys_toml, oai, routes, settled

#: one CHEAP answer at GPT's prices, in nano-USD
CHEAP_NANO = round(cost(CHEAP, GPT) * 1e9)


@pytest.fixture(scope="module")
def usage() -> Iterator[UsageUpstream]:
    state = UsageUpstream()
    server = ScriptedUpstream(state.handler()).start()
    state.url = server.url  # type: ignore[attr-defined]
    yield state
    server.stop()


@pytest.fixture
def budgeted(usage: UsageUpstream) -> Iterator[GatewayServer]:
    usage.figures = CHEAP
    usage.bodies.clear()
    gw = GatewayServer(gateway_config(keys_toml(usage.url, key_a="budget_usd = 1.0"))).start()  # type: ignore[attr-defined]
    yield gw
    gw.stop()


@pytest.fixture
def lines() -> Iterator[AccessLines]:
    with AccessLines() as log:
        yield log


def _include_usage(body: dict[str, object]) -> object:
    options = body.get("stream_options")
    return options.get("include_usage") if isinstance(options, dict) else None


def test_a_priced_stream_asks_for_usage_the_client_does_not_see(budgeted, usage, lines):
    stream = oai(budgeted, KEY_A).chat.completions.create(
        model="gpt-4o", messages=MSG, max_tokens=1000, stream=True
    )
    chunks = list(stream)
    assert [c.choices[0].delta.content for c in chunks if c.choices] == ["hi", None]
    assert all(c.choices for c in chunks)  # the usage chunk (choices: []) was kept back
    assert all(c.usage is None for c in chunks)
    (body,) = usage.bodies
    assert _include_usage(body) is True  # asked upstream for what the client did not ask
    (line,) = lines.wait(1)
    assert line["tokens"] == {"input": CHEAP.input, "output": CHEAP.output}
    assert line["cost_usd"] == pytest.approx(cost(CHEAP, GPT), rel=1e-12)
    settled(budgeted, KEY_A, CHEAP_NANO)  # charged the usage, not the reservation


def test_a_client_that_asks_for_usage_still_gets_it(budgeted, usage, lines):
    chunks = list(
        oai(budgeted, KEY_A).chat.completions.create(
            model="gpt-4o",
            messages=MSG,
            max_tokens=1000,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (20, 1000)
    (body,) = usage.bodies
    assert body["stream_options"] == {"include_usage": True}  # the client's own
    (line,) = lines.wait(1)
    assert line["cost_usd"] == pytest.approx(cost(CHEAP, GPT), rel=1e-12)
    settled(budgeted, KEY_A, CHEAP_NANO)


def test_a_client_that_said_no_to_usage_is_asked_for_and_not_shown(budgeted, usage, lines):
    chunks = list(
        oai(budgeted, KEY_A).chat.completions.create(
            model="gpt-4o",
            messages=MSG,
            max_tokens=1000,
            stream=True,
            stream_options={"include_usage": False},
        )
    )
    assert all(c.choices and c.usage is None for c in chunks)
    (body,) = usage.bodies
    assert body["stream_options"] == {"include_usage": True}
    (line,) = lines.wait(1)
    assert line["cost_usd"] == pytest.approx(cost(CHEAP, GPT), rel=1e-12)


def test_an_unpriced_stream_goes_upstream_as_the_client_sent_it(usage, lines):
    usage.bodies.clear()
    gw = GatewayServer(gateway_config(routes(usage.url))).start()  # type: ignore[attr-defined]
    try:
        chunks = list(
            oai(gw).chat.completions.create(model="llama-3-70b", messages=MSG, stream=True)
        )
    finally:
        gw.stop()
    assert all(c.usage is None for c in chunks)
    (body,) = usage.bodies
    assert "stream_options" not in body
    (line,) = lines.wait(1)
    assert line["cost_usd"] is None


def test_a_key_with_tpm_asks_for_the_usage_of_an_unpriced_stream(budgeted, usage, lines):
    chunks = list(
        oai(budgeted, KEY_TPM).chat.completions.create(
            model="llama-3-70b", messages=MSG, max_tokens=100, stream=True
        )
    )
    assert all(c.choices and c.usage is None for c in chunks)
    (body,) = usage.bodies
    assert _include_usage(body) is True  # tpm is reconciled with the usage: it is asked for
    (line,) = lines.wait(1)
    assert line["tokens"] == {"input": CHEAP.input, "output": CHEAP.output}
    assert line["cost_usd"] is None


def test_a_priced_completions_stream_asks_too(lines):
    toml = f"""
[[backends]]
name = "mock"
url = "mock://"
provider = "mock"

[[routes]]
name = "all"
models = ["*"]
backends = ["mock"]

[logging]
access_log = "all"
{PRICES}
"""
    gw = GatewayServer(gateway_config(toml)).start()
    try:
        chunks = list(
            oai(gw).completions.create(
                model="gpt-4o-mini", prompt="one two three", max_tokens=5, stream=True
            )
        )
    finally:
        gw.stop()
    assert all(c.choices and c.usage is None for c in chunks)
    (line,) = lines.wait(1)
    assert line["tokens"] == {"input": 3, "output": 5}  # the mock's usage chunk, read
    assert line["cost_usd"] == pytest.approx((3 * GPT["input"] + 5 * GPT["output"]) / 1e6)


def test_a_cached_stream_replays_usage_only_to_a_client_that_asks(usage, lines):
    usage.figures = Figures(input=300, output=40)
    usage.bodies.clear()
    gw = GatewayServer(gateway_config(routes(usage.url))).start()  # type: ignore[attr-defined]
    client = oai(gw)

    def ask(**extra: object) -> list:
        return list(
            client.chat.completions.create(
                model="gpt-4o", messages=MSG, temperature=0, stream=True, **extra
            )
        )

    try:
        filled = ask()  # a miss: asked upstream for usage, stored with it
        with_usage = ask(stream_options={"include_usage": True})  # a hit
        without = ask()  # a hit
    finally:
        gw.stop()
    assert len(usage.bodies) == 1 and _include_usage(usage.bodies[0]) is True
    assert all(c.usage is None for c in filled + without)
    assert with_usage[-1].choices == []
    assert (with_usage[-1].usage.prompt_tokens, with_usage[-1].usage.completion_tokens) == (300, 40)
    logged = lines.wait(3)
    assert [line["cache"] for line in logged] == ["miss", "hit", "hit"]
    assert [line["cost_usd"] for line in logged] == [
        pytest.approx(cost(Figures(input=300, output=40), GPT)),
        0.0,
        0.0,
    ]


# ---------------------------------------------------------------- a client that cuts the stream

RELAYED = 5  # content events the scripted upstream sends before it holds


class HeldStream:
    """An upstream that streams :data:`RELAYED` content events, then holds (bounded) until
    released: a client that stops reading there never gets a usage chunk."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.bodies: list[bytes] = []

    async def handle(self, req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        self.bodies.append(req.body)
        writer.write(sse_head())
        for _ in range(RELAYED):
            writer.write(chunk(chat_chunk("word", model="gpt-4o")))
        await writer.drain()
        await asyncio.to_thread(self.release.wait, 20)
        writer.write(chunk(b"data: [DONE]\n\n") + LAST_CHUNK)
        return False


def test_a_client_that_cuts_the_stream_is_charged_what_was_relayed(lines):
    held = HeldStream()
    upstream = ScriptedUpstream(held.handle).start()
    gw = GatewayServer(gateway_config(keys_toml(upstream.url, key_a="budget_usd = 1.0"))).start()
    try:
        stream = oai(gw, KEY_A).chat.completions.create(
            model="gpt-4o",
            messages=MSG,
            max_tokens=1000,
            stream=True,
            stream_options={"include_usage": True},  # the client's bytes go upstream as sent
        )
        seen = [c.choices[0].delta.content for _, c in zip(range(RELAYED), stream, strict=False)]
        assert seen == ["word"] * RELAYED
        stream.close()  # gone before any usage arrived
        (line,) = lines.wait(1)
        (sent,) = held.bodies
        input_estimate = -(-len(sent) // 4)  # docs/spec.md §20: the body's bytes / 4
        want = (input_estimate * GPT["input"] + RELAYED * GPT["output"]) / 1e6
        assert line["status"] == 499
        assert line["tokens"] == {"input": input_estimate, "output": RELAYED}
        assert line["cost_usd"] == pytest.approx(want, rel=1e-12) and want > 0
        settled(gw, KEY_A, round(want * 1e9))  # the budget: that amount, nothing reserved
        labels = {"route": "all", "model": "gpt-4o", "tenant": "team-a"}
        assert sample(gw.url, "gateway_cost_usd_total", **labels) == pytest.approx(want)
    finally:
        held.release.set()
        gw.stop()
        upstream.stop()


def _event(kind: str, obj: dict[str, object]) -> bytes:
    return f"event: {kind}\n".encode() + b"data: " + orjson.dumps({"type": kind, **obj}) + b"\n\n"


class HeldMessages(HeldStream):
    """An Anthropic messages stream: ``message_start`` reports the input (and 1 output token),
    :data:`RELAYED` text deltas follow, then it holds; its final output count never comes."""

    async def handle(self, req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
        usage = {"input_tokens": 700, "output_tokens": 1}
        message = {"id": "msg_h", "type": "message", "role": "assistant", "model": "claude-x"}
        message |= {"content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
        writer.write(sse_head() + chunk(_event("message_start", {"message": message})))
        block = {"index": 0, "content_block": {"type": "text", "text": ""}}
        writer.write(chunk(_event("content_block_start", block)))
        delta = {"index": 0, "delta": {"type": "text_delta", "text": "word"}}
        for _ in range(RELAYED):
            writer.write(chunk(_event("content_block_delta", delta)))
        await writer.drain()
        await asyncio.to_thread(self.release.wait, 20)
        return False


def test_a_cut_messages_stream_is_charged_its_reported_input_and_the_relayed_output(lines):
    held = HeldMessages()
    upstream = ScriptedUpstream(held.handle).start()
    gw = GatewayServer(gateway_config(routes(upstream.url))).start()
    try:
        client = anthropic_client(gw.url, "sk-none")
        stream = client.messages.create(
            model="claude-x", max_tokens=1000, messages=MSG, stream=True
        )
        deltas = 0
        for event in stream:
            deltas += event.type == "content_block_delta"
            if deltas == RELAYED:
                break
        stream.close()
        (line,) = lines.wait(1)
    finally:
        held.release.set()
        gw.stop()
        upstream.stop()
    assert line["status"] == 499
    assert line["tokens"] == {"input": 700, "output": RELAYED}  # input as reported
    want = (700 * CLAUDE["input"] + RELAYED * CLAUDE["output"]) / 1e6
    assert line["cost_usd"] == pytest.approx(want, rel=1e-12)


def test_the_usage_chunk_is_recognised_by_its_shape():
    from gateway.streaming.relay import _usage_only

    usage = orjson.loads(b'{"choices": [], "usage": {"prompt_tokens": 1}}')
    azure_filter = orjson.loads(b'{"choices": [], "prompt_filter_results": []}')
    assert _usage_only(usage)
    assert not _usage_only(azure_filter)  # no usage: relayed as it came
    assert not _usage_only({"choices": [{}], "usage": None}) and not _usage_only(None)
