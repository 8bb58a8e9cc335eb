"""The Agents SDK's ``OpenAIConversationsSession`` through a route of two backends that each
hold their own conversations (docs/spec.md §24): the session creates a conversation, reads its
history and adds each turn's items — every call after the first names the conversation, and
must reach the backend holding it."""

from __future__ import annotations

import asyncio
from typing import Any

from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
from agents.memory import OpenAIConversationsSession
from openai import AsyncOpenAI

from tests.stateful.support import pair_toml
from tests.support import gateway_config


def test_an_agent_s_conversation_session_keeps_its_history_on_one_backend(gateway, mock_pair):
    a, b = mock_pair
    server = gateway(gateway_config(pair_toml(a.url, b.url)))
    set_tracing_disabled(True)

    async def main() -> list[Any]:
        client = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        try:
            agent = Agent(
                name="Chat",
                instructions="Answer briefly.",
                model=OpenAIResponsesModel(model="gpt-4o", openai_client=client),
            )
            session = OpenAIConversationsSession(openai_client=client)
            async with asyncio.timeout(60):
                for turn in ("hello", "and again", "once more"):
                    await Runner.run(agent, turn, session=session)
                return await session.get_items()
        finally:
            await client.close()

    items = asyncio.run(main())
    made = [c for m in (a, b) for c in m.objects.conversations.meta]
    assert len(made) == 1  # made once, on one backend
    said = [i["content"][0]["text"] for i in items if i.get("role") == "user"]
    assert said == ["hello", "and again", "once more"]  # every turn reached that backend
    assert len(items) == 6  # each turn: the user's message and the answer
