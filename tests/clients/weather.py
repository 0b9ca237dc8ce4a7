"""The one tool every client's agent gets, and the script of its two-step loop.

A random model never calls a tool by itself: step one names the tool in ``tool_choice``
(vLLM then constrains the arguments to the schema, which must be bounded: an enum here),
step two answers the tool's result with ``tool_choice: "none"`` where the client can say
so (or "auto", where a few tokens of random text end the loop).
"""

from __future__ import annotations

from typing import Literal, get_args

NAME = "get_weather"
DESCRIPTION = "Current weather in a city."
City = Literal["Paris", "Oslo"]
CITIES = get_args(City)
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": list(CITIES)}},
    "required": ["city"],
    "additionalProperties": False,
}
PROMPT = "What is the weather in Paris?"
MAX_TOKENS = 24  # the forced call takes 12 tokens; the final answer is random text anyway
API_KEY = "sk-not-checked"


def get_weather(city: str) -> str:
    """The tool itself; its answer is easy to find in the next request."""
    return f"{city}: sunny, 21 C"


def openai_tool() -> dict:
    """The tool in Chat Completions form."""
    return {
        "type": "function",
        "function": {"name": NAME, "description": DESCRIPTION, "parameters": PARAMETERS},
    }


def forced() -> dict:
    """``tool_choice`` that forces the call."""
    return {"type": "function", "function": {"name": NAME}}
