"""LangChain: ``create_agent`` (a LangGraph graph) with ``ChatOpenAI`` on a custom base URL."""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import wrap_model_call
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from tests.clients import weather


@tool
def get_weather(city: weather.City) -> str:
    """Current weather in a city."""
    return weather.get_weather(city)


@wrap_model_call
def force_tool_first(request: Any, handler: Any) -> Any:
    """Step one must call the tool; once its result is in, answer without tools."""
    answered = any(isinstance(message, ToolMessage) for message in request.messages)
    return handler(request.override(tool_choice="none" if answered else weather.NAME))


def run(base_url: str, model: str, *, stream: bool) -> str:
    chat = ChatOpenAI(
        model=model,
        base_url=base_url,
        api_key=SecretStr(weather.API_KEY),
        max_retries=0,
        temperature=0.0,
        streaming=stream,
        max_completion_tokens=weather.MAX_TOKENS,
    )
    agent = create_agent(chat, tools=[get_weather], middleware=[force_tool_first])
    state = agent.invoke({"messages": [{"role": "user", "content": weather.PROMPT}]})
    return str(state["messages"][-1].content)
