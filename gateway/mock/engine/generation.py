"""Deterministic text per prompt: a random source seeded by (model, prompt), words, token
counts, and the text of an answer that is not a tool call."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any, TypeGuard

import orjson

from gateway.mock.engine.knobs import MockSettings
from gateway.mock.schema import fake
from gateway.mock.tools import Turn

# one readable sentence, split once at import
_WORDS = (  # noqa: SIM905
    "the quick brown fox jumps over a lazy dog while gateways relay every token "
    "with honest latency spans traced from edge to upstream and back again through "
    "caches streams routers hops timelines budgets metrics logs models prompts answers "
    "fast lean bounded measured clear"
).split()


def _rng(model: str, prompt: Any) -> random.Random:
    return random.Random(hashlib.sha256(orjson.dumps([model, prompt])).digest())


def _text_tokens(rng: random.Random, n: int) -> list[str]:
    words = [rng.choice(_WORDS) for _ in range(n)]
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def _count_words(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_count_words(v) for v in value)
    if isinstance(value, dict):
        return _count_words(value.get("content")) + _count_words(value.get("text"))
    return 0


def _positive_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _words(rng: random.Random) -> Callable[[], str]:
    """A source of a few words per free string of a made-up JSON value."""
    return lambda: "".join(_text_tokens(rng, 2))


def _turn_text(turn: Turn, rng: random.Random) -> str:
    """The text of an answer that is not a tool call: the tool results, or JSON for the schema
    (its strings saying the tool results when there are some)."""
    if turn.schema is None:
        return turn.results or ""
    said = turn.results
    words = _words(rng) if said is None else lambda: said
    return orjson.dumps(fake(turn.schema, words)).decode()


def _output_length(limit: int | None, settings: MockSettings) -> tuple[int, bool]:
    """(tokens, cut short): ``output_tokens`` unless the request's limit is smaller."""
    natural = settings.output_tokens
    if limit is not None and limit < natural:
        return limit, True
    return natural, False
