"""Locust load test for any OpenAI-compatible base URL (the gateway, or an upstream directly).

    locust -f loadtests/locustfile.py --headless -u 20 -r 5 -t 1m --host http://127.0.0.1:8080

Users (weights in brackets): chat JSON [3], chat stream [3], embeddings [1], and a
repeated-prompt mix [2] that sends one of a few deterministic prompts so the response cache is
exercised. Streams are parsed as SSE events: time to first token (``TTFT``) and the time between
tokens (``TBT``) are reported as request types of their own. Models are taken from
``LOCUST_MODEL`` / ``LOCUST_EMBEDDING_MODEL`` (defaults suit the built-in mock), the key
from ``LOCUST_API_KEY``. Streamed answers are checked: they must end with ``data: [DONE]``
and carry no error event, or the request counts as a failure.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from collections.abc import Iterable, Iterator
from typing import Any

from locust import HttpUser, between, events, task

MODEL = os.environ.get("LOCUST_MODEL", "mock-gpt-4o")
EMBEDDING_MODEL = os.environ.get("LOCUST_EMBEDDING_MODEL", "mock-embedding-3-small")
HEADERS = {
    "Authorization": f"Bearer {os.environ.get('LOCUST_API_KEY', 'sk-locust')}",
    "Content-Type": "application/json",
}
PROMPTS = ["What is a gateway?", "Name three colours.", "Say hello.", "Count to five."]


def _chat(content: str, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def sse_data(chunks: Iterable[bytes]) -> Iterator[str]:
    """The ``data`` of each SSE event as it completes, across any chunking of the bytes.

    Parsing the events (instead of matching bytes such as ``"content":"``) works whatever
    whitespace the server's JSON uses (Python's json.dumps writes ``"content": "``).
    """
    buf = b""
    for piece in chunks:
        buf += piece.replace(b"\r\n", b"\n")
        while b"\n\n" in buf:
            raw, buf = buf.split(b"\n\n", 1)
            lines = [
                line[5:].removeprefix(b" ")
                for line in raw.split(b"\n")
                if line.startswith(b"data:")
            ]
            if lines:
                yield b"\n".join(lines).decode("utf-8", "replace")


def has_content(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or choice.get("text"):
            return True
    return False


def _report(kind: str, name: str, seconds: float) -> None:
    events.request.fire(
        request_type=kind,
        name=name,
        response_time=seconds * 1000,
        response_length=0,
        exception=None,
        context={},
    )


class GatewayUser(HttpUser):
    wait_time = between(0.05, 0.2)

    @task(3)
    def chat_json(self) -> None:
        body = _chat(f"Tell me something ({random.random():.6f})", max_tokens=32)
        with self.client.post(
            "/v1/chat/completions", json=body, headers=HEADERS, name="chat", catch_response=True
        ) as resp:
            if resp.status_code != 200 or "choices" not in resp.text:
                resp.failure(f"status {resp.status_code}")

    @task(3)
    def chat_stream(self) -> None:
        body = _chat(
            f"Stream something ({random.random():.6f})",
            stream=True,
            max_tokens=32,
            stream_options={"include_usage": True},
        )
        start = time.perf_counter()
        tokens: list[float] = []  # arrival time of each content-bearing event
        ended = errored = False
        with self.client.post(
            "/v1/chat/completions",
            json=body,
            headers=HEADERS,
            stream=True,
            name="chat stream",
            catch_response=True,
        ) as resp:
            if resp.status_code != 200:
                resp.failure(f"status {resp.status_code}")
                return
            for data in sse_data(resp.iter_content(chunk_size=None)):
                if data == "[DONE]":
                    ended = True
                    continue
                try:
                    event = json.loads(data)
                except ValueError:
                    continue
                if "error" in event:
                    errored = True
                elif has_content(event):
                    tokens.append(time.perf_counter())
            if errored:
                resp.failure("the stream ended with an error event")
            elif not ended:
                resp.failure("the stream ended without data: [DONE]")
        if tokens:
            _report("TTFT", "chat stream", tokens[0] - start)
        for earlier, later in itertools.pairwise(tokens):
            _report("TBT", "chat stream", later - earlier)  # time between tokens

    @task(1)
    def embeddings(self) -> None:
        body = {"model": EMBEDDING_MODEL, "input": f"embed me {random.randint(0, 10**9)}"}
        with self.client.post(
            "/v1/embeddings", json=body, headers=HEADERS, name="embeddings", catch_response=True
        ) as resp:
            if resp.status_code != 200 or not json.loads(resp.content).get("data"):
                resp.failure(f"status {resp.status_code}")

    @task(2)
    def repeated_prompt(self) -> None:
        body = _chat(random.choice(PROMPTS), temperature=0, max_tokens=16)
        with self.client.post(
            "/v1/chat/completions",
            json=body,
            headers=HEADERS,
            name="chat (repeated, cacheable)",
            catch_response=True,
        ) as resp:
            if resp.status_code != 200:
                resp.failure(f"status {resp.status_code}")
            else:
                cache = resp.headers.get("x-gateway-cache", "none")
                events.request.fire(
                    request_type="CACHE",
                    name=cache,
                    response_time=0,
                    response_length=0,
                    exception=None,
                    context={},
                )
