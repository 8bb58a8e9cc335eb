"""Does a proxy really proxy? A JSON chat completion and a stream, through it to nginx.

The upstream is ``overhead.py``'s nginx started with ``streams=True``: a body shorter than
``STREAM_BODY_BYTES`` gets the fixed ``chat.completion`` (UPSTREAM_BODY), a longer one the same
answer as a ``chat.completion.chunk`` stream (UPSTREAM_SSE). Each check reads the answer's text
back out (the whole of it, from the message or from the deltas), so a proxy that answers by
itself, or drops or garbles a stream, fails here with what it said instead of being measured.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from overhead import STREAM_BODY_BYTES, tail

#: the text nginx's answer carries, as a message and as the stream's deltas joined
EXPECTED = "Hello! How can I help you today?"


class CheckFailed(RuntimeError):
    """The proxy did not pass a chat completion through; the message says what it did."""


def request_body(model: str, stream: bool) -> bytes:
    """A chat completion request; the stream's is padded past STREAM_BODY_BYTES so that nginx
    answers it with the stream (every peer forwards the messages as they are)."""
    content = "peers check" if not stream else "peers check " + "x" * (STREAM_BODY_BYTES + 2048)
    body: dict[str, Any] = {
        "model": model,
        "temperature": 0,
        "max_tokens": 32,
        "messages": [{"role": "user", "content": content}],
    }
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


def post(
    port: int, body: bytes, headers: dict[str, str], timeout: float = 10.0
) -> tuple[int, str, bytes]:
    """POST /v1/chat/completions on 127.0.0.1:port -> (status, content type, body); a
    connection that fails or breaks raises CheckFailed saying how."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=body,
            headers={"Content-Type": "application/json", **headers},
        )
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise CheckFailed(f"the request failed: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()


def _said(data: bytes) -> str:
    text = data[:400].decode("utf-8", errors="replace").replace("\n", "\\n")
    return text + ("…" if len(data) > 400 else "")


def check_json(port: int, headers: dict[str, str], model: str) -> None:
    status, ctype, data = post(port, request_body(model, stream=False), headers)
    if status != 200:
        raise CheckFailed(f"a JSON chat completion was answered {status}: {_said(data)}")
    try:
        content = json.loads(data)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise CheckFailed(
            f"a JSON chat completion's answer ({ctype}) has no choices[0].message.content "
            f"({exc!r}): {_said(data)}"
        ) from exc
    if content != EXPECTED:
        raise CheckFailed(f"a JSON chat completion came back as {content!r}, not {EXPECTED!r}")


def stream_text(data: bytes) -> tuple[str, bool]:
    """The deltas' content of an SSE chat completion stream joined, and whether it ended with
    ``data: [DONE]``."""
    parts: list[str] = []
    done = False
    for line in data.decode("utf-8", errors="replace").splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        for choice in json.loads(payload).get("choices") or []:
            parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts), done


def check_stream(port: int, headers: dict[str, str], model: str) -> None:
    status, ctype, data = post(port, request_body(model, stream=True), headers)
    if status != 200:
        raise CheckFailed(f"a streamed chat completion was answered {status}: {_said(data)}")
    if not ctype.startswith("text/event-stream"):
        raise CheckFailed(f"a streamed chat completion was answered as {ctype!r}: {_said(data)}")
    try:
        content, done = stream_text(data)
    except (ValueError, AttributeError) as exc:
        raise CheckFailed(f"a stream's event is not a chunk ({exc!r}): {_said(data)}") from exc
    if content != EXPECTED or not done:
        raise CheckFailed(
            f"a stream carried {content!r} ({'with' if done else 'without'} data: [DONE]), "
            f"not {EXPECTED!r} and [DONE]: {_said(data)}"
        )


def wait_ready(
    proc: subprocess.Popen[bytes],
    port: int,
    headers: dict[str, str],
    model: str,
    timeout: float,
    log: Path,
) -> float:
    """Wait until a JSON chat completion passes through; the seconds it took. A proxy that
    exits, or still fails when ``timeout`` is up, raises with its last answer and log."""
    t0 = time.monotonic()
    last = "nothing listened on its port"
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise CheckFailed(f"it exited with status {proc.returncode}\n{tail(log)}")
        try:
            check_json(port, headers, model)
            return time.monotonic() - t0
        except CheckFailed as exc:
            if not isinstance(exc.__cause__, ConnectionRefusedError):  # refused: not up yet
                last = str(exc)
        time.sleep(0.5)
    raise CheckFailed(f"no chat completion passed within {timeout:.0f} s: {last}\n{tail(log)}")
