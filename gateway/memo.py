"""Bounded memo tables for per-request parses of client-chosen values.

Header values, model names and attribute values come from clients, so every table that
remembers a parse of one is bounded: when full it is emptied and refills with what is in use.
"""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def remember(table: dict[K, V], key: K, value: V, limit: int) -> V:
    """Store ``value`` under ``key`` (emptying ``table`` first when it holds ``limit``)."""
    if len(table) >= limit:
        table.clear()
    table[key] = value
    return value
