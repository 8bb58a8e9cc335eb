"""An OpenAI Agents SDK agent with one local function tool, through the gateway on the embedded
default: the agent loop really calls the tool, and the final output says its result.

Both model classes the SDK ships for OpenAI-compatible servers (chat/completions and the
Responses API), each run to completion and streamed, plus a structured ``output_type``. Tracing
export is disabled, so nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents import (
    Agent,
    Model,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from pydantic import BaseModel

from tests.support import GatewayServer, async_openai_client

QUESTION = "What is the weather in Paris?"


class Report(BaseModel):
    city: str
    summary: str


def weather_tool(calls: list[str]) -> Any:
    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"It is 21 degrees and sunny in {city}"

    return get_weather


def run_agent(
    gateway: GatewayServer, api: str, streamed: bool, output_type: Any = None
) -> tuple[Any, list[str], list[Any]]:
    """Run the agent to its final output: (final output, the tool's calls, the run's items)."""
    set_tracing_disabled(True)
    calls: list[str] = []

    async def main() -> tuple[Any, list[Any]]:
        client = async_openai_client(gateway.base_url, "x")
        model: Model = (
            OpenAIChatCompletionsModel(model="gpt-4o", openai_client=client)
            if api == "chat"
            else OpenAIResponsesModel(model="gpt-4o", openai_client=client)
        )
        agent = Agent(
            name="Weather",
            instructions="Answer with the weather tool.",
            tools=[weather_tool(calls)],
            model=model,
            output_type=output_type,
        )
        try:
            async with asyncio.timeout(60):
                if streamed:
                    run = Runner.run_streamed(agent, QUESTION)
                    async for _ in run.stream_events():
                        pass
                    return run.final_output, run.new_items
                result = await Runner.run(agent, QUESTION)
                return result.final_output, result.new_items
        finally:
            await client.close()

    final, items = asyncio.run(main())
    return final, calls, items


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_agent_calls_its_tool_and_answers_with_the_result(embedded, api, streamed):
    final, calls, items = run_agent(embedded, api, streamed)
    assert len(calls) == 1 and calls[0]  # the agent loop called the local function once
    kinds = [item.type for item in items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert isinstance(final, str)
    assert f"It is 21 degrees and sunny in {calls[0]}" in final


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_agent_structured_output_carries_the_tool_result(embedded, api):
    final, calls, _ = run_agent(embedded, api, streamed=False, output_type=Report)
    assert len(calls) == 1
    assert isinstance(final, Report)
    assert f"It is 21 degrees and sunny in {calls[0]}" in final.summary
