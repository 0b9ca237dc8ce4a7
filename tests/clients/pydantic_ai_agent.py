"""pydantic-ai: an ``Agent`` on ``OpenAIChatModel`` with an OpenAI provider at our URL."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

from tests.clients import weather


@dataclasses.dataclass
class ForceToolFirst(AbstractCapability[Any]):
    """Step one must call the tool, step two must not: pydantic-ai takes a per-step
    ``tool_choice`` only from a capability (a static forced one is refused). Naming every
    tool the agent has turns into ``"required"``, which a random model never finishes
    (vLLM's schema for it is an open-ended array), hence the second tool."""

    def get_model_settings(self) -> Any:
        def settings(ctx: RunContext[Any]) -> ModelSettings:
            return {"tool_choice": [weather.NAME] if ctx.run_step <= 1 else "none"}

        return settings


def get_weather(city: weather.City) -> str:
    """Current weather in a city."""
    return weather.get_weather(city)


def get_time(city: weather.City) -> str:
    """Local time in a city (never called: it makes the forced choice a named one)."""
    return f"{city}: 12:00"


def run(base_url: str, model: str, *, stream: bool) -> str:
    return asyncio.run(_run(base_url, model, stream))


async def _run(base_url: str, model: str, stream: bool) -> str:
    provider = OpenAIProvider(base_url=base_url, api_key=weather.API_KEY)
    agent = Agent(
        OpenAIChatModel(model, provider=provider),
        tools=[get_weather, get_time],
        capabilities=[ForceToolFirst()],
        model_settings={"max_tokens": weather.MAX_TOKENS, "temperature": 0.0},
    )
    if not stream:
        return (await agent.run(weather.PROMPT)).output
    async with agent.run_stream(weather.PROMPT) as result:
        return await result.get_output()
