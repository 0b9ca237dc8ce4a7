"""Synthetic agent sessions of a chosen shape, for the warm-up matrix: how long the system
prompt is and how much of it every session shares, how many tools, how many parallel
calls per step, how large the tool results, how many steps.

The dev traces have one shape (a ~7k-character system prompt shared by a few dozen
conversations, 14 tools, mostly one call per step); these vary it. Seeded and
deterministic; each session is a replayable trace conversation (the simulator answers
the recorded assistant messages).
"""

from __future__ import annotations

import dataclasses
import json
import random

from proxy.replay.traces import Conversation

_VOCABULARY = (
    "account order refund policy customer verify status shipment invoice address plan "
    "change confirm request record detail number charge payment method balance update "
    "service support ticket priority escalate note review approve reject cancel renew "
    "limit window period region contract device line number transfer booking flight seat "
    "fare baggage route passenger reservation schedule delay credit voucher loyalty tier "
    "member exchange return warranty repair replacement model serial item stock price"
)
WORDS = tuple(_VOCABULARY.split())


@dataclasses.dataclass(frozen=True)
class Shape:
    sessions: int = 24
    system_chars: int = 20_000
    shared: float = 1.0  # the part of the system prompt every session has (0: none)
    tools: int = 13
    parallel: int = 1  # tool calls per step
    result_chars: int = 600  # per tool result
    steps: int = 8  # model calls per session; all but the last end in tool calls

    def __post_init__(self) -> None:
        if not 0.0 <= self.shared <= 1.0:
            raise ValueError("shared must be within 0..1")
        if self.sessions < 1 or self.steps < 2 or self.parallel < 1 or self.tools < 1:
            raise ValueError("a shape needs sessions, tools, parallel calls and 2+ steps")


def text(rng: random.Random, chars: int) -> str:
    """About ``chars`` characters of sentences made of WORDS."""
    out: list[str] = []
    size = 0
    while size < chars:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16)))
        out.append(sentence.capitalize() + ".")
        size += len(out[-1]) + 1
    return " ".join(out)[:chars]


def tools(count: int, seed: int) -> list[dict]:
    rng = random.Random(f"tools:{seed}")
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{index}_{rng.choice(WORDS)}",
                "description": text(rng, 240),
                "parameters": {
                    "type": "object",
                    "properties": {
                        name: {"type": "string", "description": text(rng, 60)}
                        for name in rng.sample(WORDS, 3)
                    },
                    "required": [],
                },
            },
        }
        for index in range(count)
    ]


def session(shape: Shape, index: int, seed: int = 0) -> Conversation:
    """Session ``index`` of ``shape``: its system prompt starts with the shared part (the
    same in every session), then its own; a task; ``steps - 1`` rounds of ``parallel``
    tool calls and their results; a final answer."""
    toolset = tools(shape.tools, seed)
    shared_chars = round(shape.system_chars * shape.shared)
    system = text(random.Random(f"shared:{seed}"), shared_chars)
    own = random.Random(f"own:{seed}:{index}")
    if shape.system_chars > shared_chars:
        system = (system + " " if system else "") + text(own, shape.system_chars - shared_chars)
    messages: list[dict] = [
        {"role": "system", "content": system},
        {"role": "user", "content": text(own, 300)},
    ]
    for step in range(shape.steps - 1):
        calls = [
            {
                "id": f"call_{index}_{step}_{k}",
                "type": "function",
                "function": {
                    "name": own.choice(toolset)["function"]["name"],
                    "arguments": json.dumps({"query": text(own, 40)}),
                },
            }
            for k in range(shape.parallel)
        ]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for call in calls:
            result = json.dumps({"result": text(own, shape.result_chars)})
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    messages.append({"role": "assistant", "content": text(own, 200)})
    return Conversation(
        id=f"shape-{seed}-{index}",
        source="shapes",
        tools=toolset,
        messages=messages,
        request={"temperature": 0.0},
        injected=frozenset(),
    )


def sessions(shape: Shape, seed: int = 0) -> list[Conversation]:
    return [session(shape, index, seed) for index in range(shape.sessions)]
