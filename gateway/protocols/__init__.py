"""One module per model API; :data:`BY_PATH` is what the router and the relays look up."""

from __future__ import annotations

from gateway.protocols.base import Api
from gateway.protocols.openai import ChatCompletions, Completions, Embeddings

#: routed endpoints (SPEC §5) -> their API
BY_PATH: dict[str, Api] = {
    "/v1/chat/completions": ChatCompletions(),
    "/v1/completions": Completions(),
    "/v1/embeddings": Embeddings(),
}
#: gen_ai.operation.name -> its API (the cache keeps the operation in its entries)
BY_OPERATION: dict[str, Api] = {api.operation: api for api in BY_PATH.values()}

__all__ = ["BY_OPERATION", "BY_PATH", "Api"]
