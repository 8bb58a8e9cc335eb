"""The ``cache`` row: one deterministic request (temperature 0) twice; ``x-gateway-cache`` and
``Age`` of the second. The only row that repeats a request."""

from __future__ import annotations

from typing import Final

from gateway.client.doctor.report import Check
from gateway.client.doctor.timed_client import RequestFailed, TimedClient, chat_body

__all__ = ["check_cache"]

#: the cheapest answer that is still an answer
CACHE_MAX_TOKENS: Final = 8


def check_cache(client: TimedClient, model: str) -> Check:
    """A deterministic request (temperature 0, a fixed prompt) twice; the second should HIT."""
    body = chat_body(model, "gateway doctor: cache check.", CACHE_MAX_TOKENS, temperature=0)
    results: list[str] = []
    age = None
    for _ in range(2):
        try:
            answer = client.fetch("POST", "/chat/completions", body)
        except RequestFailed as exc:
            return Check("cache", None, None, "HIT", "fail", str(exc))
        if not answer.ok:
            return Check("cache", None, None, "HIT", "fail", client.error(answer))
        state = answer.headers.get("x-gateway-cache")
        if state is None:
            detail = "no x-gateway-cache header: not a gateway with a response cache"
            return Check("cache", None, None, "HIT", "skip", "", detail)
        results.append(state.upper())
        age = answer.headers.get("age")
    second = results[-1]
    detail = f"{results[0]} then {second}" + (f", Age {age} s" if age is not None else "")
    if second == "HIT":
        return Check("cache", second, None, "HIT", "ok", "", detail)
    hint = (
        "a repeated deterministic request was not served from the cache: check [cache] "
        "(backend, mode, ttl; Redis reachable?)"
    )
    return Check("cache", second, None, "HIT", "warn", hint, detail)
