"""What tests/test_spend.py shares: an upstream whose usage figures the test chooses (every
protocol, JSON and stream), prices, keys and budgets, and readers of the access log and the
metrics.

:func:`usage_upstream` answers ``/chat/completions``, ``/completions``, ``/embeddings``,
``/responses`` and ``/messages`` — as JSON, or as the protocol's stream when the body asks for
one — with the :class:`Figures` of the moment (``upstream_figures[0]``, changeable between
requests), each in its protocol's own fields. With ``hold`` set, every answer waits until the
event is set (bounded): requests can be held in flight together.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx2
import orjson

from gateway.telemetry.logs import ACCESS_LOGGER
from tests.support import LAST_CHUNK, Handler, SeenRequest, chunk, http_response, sse_head

#: USD per 1M tokens of the test's [[prices]]
GPT = {"input": 2.5, "cached_input": 1.25, "output": 10.0}
CLAUDE = {"input": 3.0, "cached_input": 0.3, "cache_write": 3.75, "output": 15.0}
EMBED = {"input": 0.02, "output": 0.0}
PRICES = f"""
[[prices]]
models = ["gpt-4o*", "o3*"]
input = {GPT["input"]}
cached_input = {GPT["cached_input"]}
output = {GPT["output"]}

[[prices]]
models = ["claude-*"]
input = {CLAUDE["input"]}
cached_input = {CLAUDE["cached_input"]}
cache_write = {CLAUDE["cache_write"]}
output = {CLAUDE["output"]}

[[prices]]
models = ["text-embedding-*"]
input = {EMBED["input"]}
output = {EMBED["output"]}
"""
HOLD_MAX_S = 20.0


@dataclass(frozen=True)
class Figures:
    """Usage as the test wants the upstream to report it (``input`` counts every input token,
    the cached ones and the cache writes included, as the gateway does)."""

    input: int = 1000
    cached: int = 0
    write: int = 0
    output: int = 100
    reasoning: int = 0


def cost(f: Figures, price: dict[str, float]) -> float:
    """docs/spec.md §20, worked out independently of the gateway."""
    cached_price = price.get("cached_input", price["input"])
    write_price = price.get("cache_write", price["input"])
    fresh = f.input - f.cached - f.write
    total = fresh * price["input"] + f.cached * cached_price + f.write * write_price
    return (total + f.output * price["output"]) / 1e6


# ---------------------------------------------------------------- protocol bodies


def _openai_usage(f: Figures) -> dict[str, Any]:
    return {
        "prompt_tokens": f.input,
        "completion_tokens": f.output,
        "total_tokens": f.input + f.output,
        "prompt_tokens_details": {"cached_tokens": f.cached},
        "completion_tokens_details": {"reasoning_tokens": f.reasoning},
    }


def _responses_usage(f: Figures) -> dict[str, Any]:
    return {
        "input_tokens": f.input,
        "input_tokens_details": {"cached_tokens": f.cached},
        "output_tokens": f.output,
        "output_tokens_details": {"reasoning_tokens": f.reasoning},
        "total_tokens": f.input + f.output,
    }


def _anthropic_usage(f: Figures, output: int) -> dict[str, Any]:
    return {
        "input_tokens": f.input - f.cached - f.write,  # Anthropic reports the parts apart
        "cache_read_input_tokens": f.cached,
        "cache_creation_input_tokens": f.write,
        "output_tokens": output,
    }


def _chat(model: str, f: Figures) -> dict[str, Any]:
    message = {"role": "assistant", "content": "hi"}
    return {
        "id": "chatcmpl-s",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": _openai_usage(f),
    }


def _response(model: str, f: Figures, status: str = "completed") -> dict[str, Any]:
    text = {"type": "output_text", "text": "hi", "annotations": []}
    item = {"type": "message", "id": "msg_s", "status": "completed", "role": "assistant"}
    return {
        "id": "resp_s",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": model,
        "output": [{**item, "content": [text]}] if status == "completed" else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": _responses_usage(f) if status == "completed" else None,
    }


def _message(model: str, f: Figures) -> dict[str, Any]:
    return {
        "id": "msg_s",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": _anthropic_usage(f, f.output),
    }


def json_body(path: str, model: str, f: Figures) -> bytes:
    if path == "/chat/completions":
        return orjson.dumps(_chat(model, f))
    if path == "/completions":
        choice = {"index": 0, "text": "hi", "logprobs": None, "finish_reason": "stop"}
        body = {"id": "cmpl-s", "object": "text_completion", "created": 1, "model": model}
        return orjson.dumps({**body, "choices": [choice], "usage": _openai_usage(f)})
    if path == "/embeddings":
        data = [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}]
        usage = {"prompt_tokens": f.input, "total_tokens": f.input}
        return orjson.dumps({"object": "list", "data": data, "model": model, "usage": usage})
    if path == "/responses":
        return orjson.dumps(_response(model, f))
    return orjson.dumps(_message(model, f))


def _data(obj: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def stream_events(path: str, model: str, f: Figures, usage: bool = True) -> list[bytes]:
    if path == "/chat/completions":
        base = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1}
        base["model"] = model
        first = {"index": 0, "delta": {"role": "assistant", "content": "hi"}}
        last = {"index": 0, "delta": {}, "finish_reason": "stop"}
        events = [
            _data({**base, "choices": [{**first, "finish_reason": None}]}),
            _data({**base, "choices": [last]}),
        ]
        if usage:
            events.append(_data({**base, "choices": [], "usage": _openai_usage(f)}))
        return [*events, b"data: [DONE]\n\n"]
    if path == "/responses":
        started = {"type": "response.created", "sequence_number": 0}
        delta = {"type": "response.output_text.delta", "sequence_number": 1, "delta": "hi"}
        delta |= {"item_id": "msg_s", "output_index": 0, "content_index": 0}
        done = {"type": "response.completed", "sequence_number": 2}
        return [
            _data({**started, "response": _response(model, f, "in_progress")}, started["type"]),
            _data(delta, delta["type"]),
            _data({**done, "response": _response(model, f)}, done["type"]),
        ]
    message = {**_message(model, f), "content": [], "stop_reason": None}
    message["usage"] = _anthropic_usage(f, 1)
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
    block["content_block"]["text"] = ""
    text = {"type": "text_delta", "text": "hi"}
    stop = {"stop_reason": "end_turn", "stop_sequence": None}
    return [
        _data({"type": "message_start", "message": message}, "message_start"),
        _data(block, "content_block_start"),
        _data({"type": "content_block_delta", "index": 0, "delta": text}, "content_block_delta"),
        _data({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        _data(
            {"type": "message_delta", "delta": stop, "usage": {"output_tokens": f.output}},
            "message_delta",
        ),
        _data({"type": "message_stop"}, "message_stop"),
    ]


class UsageUpstream:
    """The handler's state: the figures it reports, and an optional hold."""

    def __init__(self, figures: Figures | None = None) -> None:
        self.figures = figures or Figures()
        #: when set to an unset Event, every answer waits for it (at most HOLD_MAX_S)
        self.hold: threading.Event | None = None
        #: requests that reached the handler (held ones included)
        self.arrived = 0
        #: the bodies the gateway sent, in order
        self.bodies: list[dict[str, Any]] = []
        #: a chat answer never reports usage: a stream whatever ``stream_options`` asks (an
        #: upstream that does not know the option), a JSON answer with ``"usage": null``
        self.deaf = False

    def handler(self) -> Handler:
        async def handle(req: SeenRequest, writer: asyncio.StreamWriter) -> bool:
            self.arrived += 1
            hold = self.hold
            if hold is not None:
                await asyncio.to_thread(hold.wait, HOLD_MAX_S)
            path = req.target.split("?", 1)[0].removeprefix("/v1")
            payload = orjson.loads(req.body) if req.body else {}
            self.bodies.append(payload)
            model = payload.get("model", "m")
            if not payload.get("stream"):
                body = json_body(path, model, self.figures)
                if self.deaf and path == "/chat/completions":
                    body = orjson.dumps({**orjson.loads(body), "usage": None})
                writer.write(http_response(200, body))
                return True
            usage = path != "/chat/completions" or (
                not self.deaf and bool((payload.get("stream_options") or {}).get("include_usage"))
            )
            writer.write(sse_head())
            for event in stream_events(path, model, self.figures, usage):
                writer.write(chunk(event))
            writer.write(LAST_CHUNK)
            return True

        return handle


# ---------------------------------------------------------------- what the gateway tells


class AccessLines(logging.Handler):
    """The access log lines of the gateways of this process, parsed (context manager)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock:
            self.lines.append(orjson.loads(record.getMessage()))

    def __enter__(self) -> AccessLines:
        logging.getLogger(ACCESS_LOGGER).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger(ACCESS_LOGGER).removeHandler(self)

    def wait(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.lines) < count:
            assert time.monotonic() < deadline, f"{len(self.lines)} access lines, not {count}"
            time.sleep(0.01)
        return self.lines[:count]


def metrics_text(url: str) -> str:
    return httpx2.get(url + "/metrics").text


def samples(url: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """Every sample of one metric: labels -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[frozenset[tuple[str, str]], float] = {}
    for family in text_string_to_metric_families(metrics_text(url)):
        for s in family.samples:
            if s.name == name:
                out[frozenset(s.labels.items())] = s.value
    return out


def sample(url: str, name: str, **labels: str) -> float:
    """One sample's value (0 when the series does not exist yet)."""
    return samples(url, name).get(frozenset(labels.items()), 0.0)
