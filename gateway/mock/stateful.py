"""The mock's stateful APIs in one place (docs/spec.md §24): a :class:`MockObjects` per mock
backend (per ``mock://`` transport, per ``gateway mock-upstream`` server) holds its files,
uploads, batches, conversations, vector stores and Anthropic batches in memory."""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from gateway.mock.batches import BATCH_DELAY_S, Batches, MessageBatches, VectorStores
from gateway.mock.engine import MockReply
from gateway.mock.objects import Conversations, Files, missing

_ROOTS = frozenset({"files", "uploads", "batches", "conversations", "vector_stores"})


class MockObjects:
    def __init__(self, batch_delay_s: float = BATCH_DELAY_S) -> None:
        self.files = Files()
        self.batches = Batches(self.files, batch_delay_s)
        self.message_batches = MessageBatches(batch_delay_s)
        self.conversations = Conversations()
        self.vector_stores = VectorStores(self.files)

    def reply(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> MockReply | None:
        """The answer to a stateful call, or None for any other path (the engine answers)."""
        parts = path.split("?", 1)[0].strip("/").split("/")
        root = parts[0]
        content_type = headers.get("content-type", "")
        if root == "responses" and method == "POST":
            return self._conversation_turn(body)
        if parts[:2] == ["messages", "batches"]:
            return self.message_batches.reply(method, parts, body)
        if root not in _ROOTS:
            return None
        if root == "files":
            # Anthropic's Files API: what its clients (and provider = "anthropic") always send
            anthropic = "anthropic-version" in headers or "files-api" in headers.get(
                "anthropic-beta", ""
            )
            return self.files.reply(method, parts, content_type, body, anthropic)
        if root == "uploads":
            return self.files.upload(method, parts, content_type, body)
        if root == "batches":
            return self.batches.reply(method, parts, body)
        if root == "conversations":
            return self.conversations.reply(method, parts, body)
        return self.vector_stores.reply(method, parts, body)

    def _conversation_turn(self, body: bytes) -> MockReply | None:
        """A Responses request naming a conversation this backend does not hold: 404; one it
        holds gets its input added to the conversation (the engine answers it)."""
        if b'"conversation"' not in body:  # the common case, without parsing the body
            return None
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        conversation = payload.get("conversation") if isinstance(payload, dict) else None
        if isinstance(conversation, dict):
            conversation = conversation.get("id")
        if not isinstance(conversation, str):
            return None
        if not self.conversations.has(conversation):
            return missing("Conversation", conversation)
        self.conversations.add_items(conversation, payload.get("input"))
        return None
