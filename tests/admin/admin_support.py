"""What the key store's tests share: a config with an admin key and a price, the admin API
as a client, a wait with a deadline."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import httpx2

ADMIN_ENV = "TEST_GATEWAY_ADMIN_KEY"
ADMIN_KEY = "admin-" + "x" * 40
os.environ[ADMIN_ENV] = ADMIN_KEY
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def admin_toml(extra: str = "", admin_extra: str = "") -> str:
    return f"""
[[backends]]
name = "mock"
url = "mock://?output_tokens=3"
[[routes]]
models = ["*"]
backends = ["mock"]
[auth]
mode = "keys"
{extra}
[admin]
key_env = "{ADMIN_ENV}"
{admin_extra}
[[prices]]
models = ["gpt-4o*"]
input = 1.0
output = 1.0
"""


def chat(url: str, key: str, model: str = "gpt-4o-mini") -> httpx2.Response:
    body = {**CHAT, "model": model}
    with httpx2.Client(timeout=5) as client:
        return client.post(f"{url}/v1/chat/completions", json=body, headers=bearer(key))


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def admin(url: str, method: str, path: str, body: Any = None) -> httpx2.Response:
    with httpx2.Client(timeout=5) as client:
        return client.request(method, f"{url}/admin/v1/{path}", json=body, headers=ADMIN)


def wait_for(predicate: Callable[[], bool], what: str, within: float = 5.0) -> None:
    """Poll until ``predicate`` holds; fail past the deadline (never a timed assertion)."""
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        time.sleep(0.02)


def code(answer: httpx2.Response) -> str | None:
    error = answer.json().get("error") or {}
    return error.get("code")
