"""The ``http2`` row (connection reuse): ``--requests`` GETs of ``/models`` on one client; the
value is what was seen (``HTTP/1.1, 1 connection for 5 requests``). The same answers list the
models the later rows use, and a 404 on a base URL without ``/v1`` while ``BASE/v1/models``
answers makes every hint say ``did you mean BASE/v1?``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Final

import orjson

from gateway.client.doctor.report import Check, Verdict
from gateway.client.doctor.timed_client import RequestFailed, TimedAnswer, TimedClient

__all__ = ["REUSE", "ModelListing", "check_reuse", "no_model_error"]

#: the http2 row's threshold: N requests on one client reuse one connection
REUSE: Final = "1 connection"


@dataclass(frozen=True, slots=True)
class ModelListing:
    """What ``GET /models`` said: the model ids, or why there are none."""

    models: list[str]
    error: str = ""


def check_reuse(client: TimedClient, n: int) -> tuple[Check, ModelListing]:
    """``n`` GETs of ``/models`` on one client: the protocol, and connections opened for them."""
    before = client.connections
    answers: list[TimedAnswer] = []
    for _ in range(n):
        try:
            answers.append(client.fetch("GET", "/models"))
        except RequestFailed as exc:
            hint = f"the requests failed: {exc}"
            return Check("http2", None, None, REUSE, "fail", hint), ModelListing([], str(exc))
    opened = client.connections - before
    failed = next((a for a in answers if not a.ok), None)
    if failed is not None and failed.status == 404:
        client.check_base()
    error = client.error(failed) if failed is not None else ""
    listing = ModelListing(next((_model_ids(a.body) for a in answers if a.ok), []), error)
    return _judge_reuse(client, answers, opened, error), listing


def _judge_reuse(client: TimedClient, answers: list[TimedAnswer], opened: int, error: str) -> Check:
    """ok only when every request succeeded and they shared a connection; the value says what
    was seen (``HTTP/1.1, 1 connection for 5 requests``)."""
    n = len(answers)
    protocols = "/".join(sorted({a.http_version for a in answers}))
    value = f"{protocols}, {opened} connection{'s' if opened != 1 else ''} for {n} requests"
    statuses = Counter(a.status for a in answers)
    detail = "GET /models: " + ", ".join(f"HTTP {s} x{c}" for s, c in sorted(statuses.items()))
    if client.base.startswith("https") and protocols != "HTTP/2":
        detail += "; the server did not negotiate h2"

    def row(verdict: Verdict, hint: str = "") -> Check:
        return Check("http2", value, None, REUSE, verdict, hint, detail)

    if error:
        return row("fail", f"GET /models answered {error}: reuse counts only on answers that work")
    if n < 2:
        return row("skip")
    if opened <= 1:
        return row("ok")
    if opened >= n:
        return row(
            "fail",
            "a new connection per request: every call pays connect + TLS again; enable "
            "keep-alive (no Connection: close, a keepalive timeout > 0) or HTTP/2",
        )
    return row("warn", "the server closed kept-alive connections early: raise its keepalive limits")


def no_model_error(client: TimedClient, listing: ModelListing) -> str:
    """The one line when no model is known: the base URL's missing /v1 first, else --model."""
    if client.v1_hint is not None:
        return f"{client.base}: GET /models answered 404: {client.v1_hint}"
    why = listing.error or "it listed none"
    return f"{client.base}: GET /models gave no model ({why}); pass --model"


def _model_ids(body: bytes) -> list[str]:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return []
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        return []
    return [d["id"] for d in data if isinstance(d, dict) and isinstance(d.get("id"), str)]
