"""One module per model API; :data:`BY_PATH` is what the router and the relays look up."""

from __future__ import annotations

from gateway.protocols.base import Api
from gateway.protocols.messages import CountTokens, Messages
from gateway.protocols.openai import ChatCompletions, Completions, Embeddings
from gateway.protocols.responses import Responses

#: routed endpoints (docs/spec.md §5) -> their API
BY_PATH: dict[str, Api] = {
    "/v1/chat/completions": ChatCompletions(),
    "/v1/completions": Completions(),
    "/v1/embeddings": Embeddings(),
    "/v1/responses": Responses(),  # OpenAI Responses API
    "/v1/messages": Messages(),  # Anthropic Messages API
    "/v1/messages/count_tokens": CountTokens(),  # its token count (docs/spec.md §22)
}
#: gen_ai.operation.name -> its API, for the cacheable APIs only (the cache keeps the operation
#: in its entries; responses and messages are "chat" too, and never cached)
BY_OPERATION: dict[str, Api] = {api.operation: api for api in BY_PATH.values() if api.cacheable}

__all__ = ["BY_OPERATION", "BY_PATH", "Api"]
