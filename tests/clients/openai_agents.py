"""The OpenAI Agents SDK: on Chat Completions (``OpenAIChatCompletionsModel``), and with a
plain string model, which the SDK sends to /v1/responses."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIProvider,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from tests.clients import weather


@function_tool
def get_weather(city: weather.City) -> str:
    """Current weather in a city."""
    return weather.get_weather(city)


def run(base_url: str, model: str, *, stream: bool) -> str:
    """The agent forces the tool on its first step; after a tool ran, the SDK resets
    ``tool_choice`` (``Agent.reset_tool_choice``), so step two ends with text."""
    return asyncio.run(_run(base_url, model, stream, responses=False))


def run_on_responses(base_url: str, model: str, *, stream: bool) -> str:
    """The same loop with the SDK's default for a string model: the Responses API."""
    return asyncio.run(_run(base_url, model, stream, responses=True))


async def _run(base_url: str, model: str, stream: bool, *, responses: bool) -> str:
    set_tracing_disabled(True)  # no trace export to api.openai.com
    client = openai.AsyncOpenAI(base_url=base_url, api_key=weather.API_KEY, max_retries=0)
    agent_model: Any = model
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client))
    if not responses:
        agent_model = OpenAIChatCompletionsModel(model=model, openai_client=client)
    agent = Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        model=agent_model,
        tools=[get_weather],
        model_settings=ModelSettings(
            tool_choice=weather.NAME, max_tokens=weather.MAX_TOKENS, temperature=0.0
        ),
    )
    async with client:
        if not stream:
            result = await Runner.run(agent, weather.PROMPT, max_turns=3, run_config=config)
            return str(result.final_output)
        streamed = Runner.run_streamed(agent, weather.PROMPT, max_turns=3, run_config=config)
        async for _ in streamed.stream_events():
            pass
        return str(streamed.final_output)
