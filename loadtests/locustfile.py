"""Locust load test for any OpenAI-compatible base URL (the gateway, or an upstream directly).

    locust -f loadtests/locustfile.py --headless -u 20 -r 5 -t 1m --host http://127.0.0.1:8080

Users (weights in brackets): chat JSON [3], chat stream [3] (time to first token is reported
as its own request type, ``TTFT``), embeddings [1], and a repeated-prompt mix [2] that sends
one of a few deterministic prompts so the response cache is exercised. Models are taken from
``LOCUST_MODEL`` / ``LOCUST_EMBEDDING_MODEL`` (defaults suit the built-in mock), the key
from ``LOCUST_API_KEY``. Streamed answers are checked: they must end with ``data: [DONE]``
and carry no error event, or the request counts as a failure.
"""

from __future__ import annotations

import json
import os
import random
import time

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
        first: float | None = None
        buf = b""
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
            for piece in resp.iter_content(chunk_size=None):
                if first is None and b'"content":"' in piece and b'"content":""' not in piece:
                    first = time.perf_counter()
                buf += piece
            if b'"error"' in buf:
                resp.failure("the stream ended with an error event")
            elif not buf.rstrip().endswith(b"data: [DONE]"):
                resp.failure("the stream ended without data: [DONE]")
        if first is not None:
            events.request.fire(
                request_type="TTFT",
                name="chat stream",
                response_time=(first - start) * 1000,
                response_length=0,
                exception=None,
                context={},
            )

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
