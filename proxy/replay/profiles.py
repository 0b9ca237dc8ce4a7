"""Client profiles: what real agent frameworks do to a prompt between two requests.

Each profile is a pure function of (prompt, conversation id, step index): no clock, no
randomness, so a replay sends the same bytes whatever the target and however often it
runs. Profiles never change the recorded objects; they return new ones where they differ.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from proxy import tokens
from proxy.replay.traces import Conversation


@dataclasses.dataclass(frozen=True)
class Prompt:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]


Profile = Callable[[Prompt, str, int], Prompt]
"""(prompt, conversation id, step index) -> the prompt the client sends."""


def faithful(prompt: Prompt, conversation: str, step: int) -> Prompt:
    """Append-only history, exactly as recorded: the best case for a prefix cache."""
    return prompt


# The virtual clock behind ``timestamped``: every conversation starts at its own fixed
# moment of one day and each step moves it on, as an agent's wall clock would.
_EPOCH = datetime.datetime(2026, 11, 29, 0, 0, 0, tzinfo=datetime.UTC)
_SECONDS_PER_STEP = 47  # a model call plus the tools it asked for
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def virtual_now(conversation: str, step: int) -> datetime.datetime:
    offset = int.from_bytes(hashlib.sha256(conversation.encode()).digest()[:4], "big") % 86_400
    return _EPOCH + datetime.timedelta(seconds=offset + step * _SECONDS_PER_STEP)


def clock_line(moment: datetime.datetime) -> str:
    # Weekday by table, not strftime("%A"), which follows the process locale.
    return f"Current date and time: {_WEEKDAYS[moment.weekday()]}, {moment:%Y-%m-%d %H:%M:%S} UTC"


def timestamped(prompt: Prompt, conversation: str, step: int) -> Prompt:
    """The system prompt starts with the current date and time, refreshed every request.

    Reproduces LangGraph's ReAct agent template (langchain-ai/react-agent, prompts.py:
    ``System time: {system_time}``, formatted with ``datetime.now()`` in every
    ``call_model``), pydantic-ai's documented dynamic system prompt
    (``@agent.system_prompt`` returning ``date.today()``), and the "timestamp precise to
    the second at the beginning of the system prompt" that Manus names as a common mistake
    ("Context Engineering for AI Agents: Lessons from Building Manus", 2025). At the start
    of the system message it is the worst case: the prefix breaks at the first block.
    """
    line = clock_line(virtual_now(conversation, step))
    messages = list(prompt.messages)
    for index, message in enumerate(messages):
        if message.get("role") == "system":
            messages[index] = {**message, "content": _prepend(line, message.get("content"))}
            return dataclasses.replace(prompt, messages=messages)
    return dataclasses.replace(prompt, messages=[{"role": "system", "content": line}, *messages])


def _prepend(line: str, content: Any) -> Any:
    if isinstance(content, list):  # content parts
        return [{"type": "text", "text": line}, *content]
    return f"{line}\n\n{content}" if content else line


def _shuffle_key(conversation: str, step: int, tool: dict[str, Any]) -> bytes:
    name = str((tool.get("function") or {}).get("name", ""))
    return hashlib.sha256(f"{conversation}\0{step}\0{name}".encode()).digest()


def reordered_tools(prompt: Prompt, conversation: str, step: int) -> Prompt:
    """The same tools in another order on every request, like iterating a set or a dict
    whose order depends on a per-process hash seed or on registration order.

    Reproduces clients that rebuild the tool list per request: MCP clients re-listing
    tools from servers each run (the OpenAI Agents SDK does unless ``cache_tools_list``
    is set), and tools gathered in a ``set`` (Python's str hash is salted per process,
    PYTHONHASHSEED). Manus (same article) warns that changing the tool list invalidates
    the cache for everything after it. The order here is a hash of (conversation, step,
    tool name): a different deterministic permutation per step.
    """
    tools = sorted(prompt.tools, key=lambda tool: _shuffle_key(conversation, step, tool))
    return dataclasses.replace(prompt, tools=tools)


def reserialize(arguments: str) -> str:
    """The same JSON arguments in the other common serialization: compact (JavaScript's
    ``JSON.stringify``) unless the engine emitted compact, then Python's ``json.dumps``
    (``", "`` / ``": "``). Arguments that are not JSON come back unchanged."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    compact = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return compact if compact != arguments else json.dumps(value)


def reserialized_args(prompt: Prompt, conversation: str, step: int) -> Prompt:
    """Tool-call arguments sent back re-serialized, JSON-equal but byte-different from
    what the engine emitted.

    Frameworks parse the model's arguments into objects and serialize them again when
    they send the history back. LangChain (langchain-openai) uses ``json.dumps``: it sends
    ``{"city": "Paris"}`` where the model emitted ``{"city":"Paris"}`` (measured here,
    tests/e2e/test_clients.py). The Vercel AI SDK (@ai-sdk/openai-compatible,
    convert-to-openai-compatible-chat-messages.ts) sends ``JSON.stringify(part.input)``:
    compact. The recorded traces hold both styles (tau2: json.dumps; tau-bench gpt-4o:
    mostly compact), so each argument string is sent in the style it was not emitted in
    (see ``reserialize``); only strings both styles agree on (``{}``) stay the same.
    """
    messages = [_reserialize_message(message) for message in prompt.messages]
    return dataclasses.replace(prompt, messages=messages)


def _reserialize_message(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not calls:
        return message
    rewritten = []
    for call in calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call = {**call, "function": {**function, "arguments": reserialize(arguments)}}
        rewritten.append(call)
    return {**message, "tool_calls": rewritten}


REASONING_FIELDS = ("reasoning_content", "reasoning")


def dropped_reasoning(prompt: Prompt, conversation: str, step: int) -> Prompt:
    """Reasoning is dropped from the assistant messages sent back.

    DeepSeek's API documents that ``reasoning_content`` must not be sent back (the
    reasoner guide: previous rounds' CoT is not concatenated into the context; input
    messages carrying it are rejected), and LangChain's ChatOpenAI does not serialize it
    into the request. Qwen3-style chat templates do the same at render time (they drop
    ``<think>`` from turns before the last user message). The recorded
    traces carry no reasoning, so on them this profile changes nothing (``notes`` says so).
    """
    messages = [
        {k: v for k, v in message.items() if k not in REASONING_FIELDS}
        if message.get("role") == "assistant" and any(f in message for f in REASONING_FIELDS)
        else message
        for message in prompt.messages
    ]
    return dataclasses.replace(prompt, messages=messages)


_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip


# What changes per step in real agents' system prompts, in formats the volatile patterns
# (proxy/rewrite/volatile.py) do and do not know: (name, lines for step ``n`` at moment
# ``t``). ``detected`` is the control the patterns recognise.
CLOCK_FORMATS: Mapping[str, Callable[[datetime.datetime, int], str]] = MappingProxyType(
    {
        "detected": lambda t, n: clock_line(t),
        "sentence": lambda t, n: f"It is now {t:%H:%M} on {t.day} {_MONTHS[t.month - 1]}.",
        "labelled": lambda t, n: f"Local time: {t:%H:%M:%S}",
        "block": lambda t, n: (
            f"## Environment\nDate: {t:%d/%m/%y}\nTime: {t:%H:%M}\nTimezone: UTC+0"
        ),
        "bare-time": lambda t, n: f"{t:%H:%M}",
        "counter": lambda t, n: f"Step {n + 1} of 60. Remaining budget: {59 - n} tool calls.",
        "growing": lambda t, n: (
            "## Scratchpad\n" + "\n".join(f"- observation {i + 1} noted" for i in range(n + 1))
        ),
        # A memory block that gains a fact a step, in words (no number tells lines apart).
        "memory": lambda t, n: "## Memory\n" + "\n".join(_fact(i) for i in range(n + 1)),
        # A labelled status in words, new every step (what the agent is doing).
        "status": lambda t, n: f"Current focus: the {_fact(n)[len('- the user asked about ') :]}",
    }
)

_FACT_WORDS = (
    "aisle", "window", "refund", "upgrade", "baggage", "loyalty", "transfer", "voucher",
    "delay", "meal", "lounge", "invoice", "address", "passport", "seat", "fare",
)  # fmt: skip


def _fact(index: int) -> str:
    """A distinct line of words for fact ``index`` (up to 16**3)."""
    words = _FACT_WORDS
    a, b, c = index % 16, index // 16 % 16, index // 256 % 16
    return f"- the user asked about {words[a]} then {words[(a + b + 5) % 16]} ({words[c]})"


CLOCK_POSITIONS = ("top", "middle", "bottom")


@dataclasses.dataclass(frozen=True)
class VariedClock:
    """The system prompt carries a value that changes every step, in one format at one
    position (``format``/``position`` None: chosen per conversation by a hash of its id,
    so a replay of many conversations covers every combination).

    What real agents put there: a clock in the framework's own words (LangGraph's
    ``System time: {system_time}`` template, pydantic-ai's dynamic system prompts), a step
    or budget counter, a scratchpad or memory block that grows (MemGPT-style core memory).
    Only ``detected`` is a format the volatile patterns know; the others measure what the
    proxy keeps of a prefix whose changing part no pattern recognises."""

    format: str | None = None
    position: str | None = None

    def __call__(self, prompt: Prompt, conversation: str, step: int) -> Prompt:
        digest = hashlib.sha256(conversation.encode()).digest()
        name = self.format or list(CLOCK_FORMATS)[digest[0] % len(CLOCK_FORMATS)]
        position = self.position or CLOCK_POSITIONS[digest[1] % len(CLOCK_POSITIONS)]
        text = CLOCK_FORMATS[name](virtual_now(conversation, step), step)
        messages = list(prompt.messages)
        for index, message in enumerate(messages):
            content = message.get("content")
            if message.get("role") == "system" and isinstance(content, str):
                messages[index] = {**message, "content": _place(text, content, position)}
                return dataclasses.replace(prompt, messages=messages)
        system = {"role": "system", "content": text}
        return dataclasses.replace(prompt, messages=[system, *messages])


def _place(text: str, content: str, position: str) -> str:
    if position == "top":
        return f"{text}\n\n{content}"
    if position == "bottom":
        return f"{content}\n\n{text}"
    head, sep, tail = content.partition("\n\n")  # after the first paragraph
    return f"{head}\n\n{text}\n\n{tail}" if sep else f"{content}\n\n{text}"


varied_clocks = VariedClock()


def mixed(prompt: Prompt, conversation: str, step: int) -> Prompt:
    """All of the above at once, as a client stacked on a framework might do."""
    for profile in (reserialized_args, dropped_reasoning, reordered_tools, timestamped):
        prompt = profile(prompt, conversation, step)
    return prompt


# Token counting for ``client-trim``, as OpenAI's cookbook counts chat messages for
# tiktoken ("How to count tokens with tiktoken", num_tokens_from_messages): 3 framing
# tokens per message plus the tokens of its text fields.
TOKENS_PER_MESSAGE = 3
TRIM_TOKENS = 4096
"""``client-trim``'s default budget: message tokens kept, system prompt included."""


@functools.cache
def _counter() -> tokens.Counter:
    tokens.provision()  # offline: tiktoken's files come from the bpe-openai package
    return tokens.counter()


@functools.lru_cache(maxsize=65_536)
def _text_tokens(text: str) -> int:
    return _counter().count(text)


def message_tokens(message: Mapping[str, Any]) -> int:
    """Tokens of one OpenAI chat message: framing, role, text content (or its text parts),
    name, and each tool call's function name and arguments (o200k_base)."""
    count = TOKENS_PER_MESSAGE + _text_tokens(str(message.get("role", "")))
    content = message.get("content")
    if isinstance(content, str):
        count += _text_tokens(content)
    elif isinstance(content, list):
        count += sum(
            _text_tokens(str(part.get("text", ""))) for part in content if isinstance(part, dict)
        )
    if isinstance(message.get("name"), str):
        count += _text_tokens(message["name"])
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        count += _text_tokens(str(function.get("name", "")))
        count += _text_tokens(str(function.get("arguments", "")))
    return count


@dataclasses.dataclass(frozen=True)
class ClientTrim:
    """The client keeps the system prompt and as many of the newest messages as fit in
    ``max_tokens`` (system prompt included; tools not counted), then drops messages from
    the front of what it kept until it starts on a user message.

    Reproduces LangChain's ``trim_messages(messages, strategy="last", include_system=True,
    start_on="human", allow_partial=False, token_counter=..., max_tokens=N)``
    (langchain_core/messages/utils.py, ``_last_max_tokens``), the configuration its
    documentation gives for a valid history ("How to trim messages": start on a human
    message so a tool message never loses its assistant tool call). Whole messages only;
    starting on a user message also drops anything before the first one that still fits
    (tau2's injected greeting), on every request alike. If not even the newest user turn
    fits, only the system prompt is sent, as ``trim_messages`` does. Tokens are counted
    with tiktoken's o200k_base (proxy.tokens). The history's start moves forward whenever
    the budget forces it past a user message, and the prefix cache then loses everything
    after the system prompt and tools.
    """

    max_tokens: int = TRIM_TOKENS

    def __call__(self, prompt: Prompt, conversation: str, step: int) -> Prompt:
        messages = prompt.messages
        if not messages:
            return prompt
        head = messages[:1] if messages[0].get("role") == "system" else []
        rest = messages[len(head) :]
        budget = max(0, self.max_tokens - sum(map(message_tokens, head)))
        start = len(rest)
        while start > 0 and message_tokens(rest[start - 1]) <= budget:
            budget -= message_tokens(rest[start - 1])
            start -= 1
        while start < len(rest) and rest[start].get("role") != "user":
            start += 1
        kept = [*head, *rest[start:]]
        if len(kept) == len(messages):
            return prompt
        return dataclasses.replace(prompt, messages=kept)


client_trim = ClientTrim()


PROFILES: Mapping[str, Profile] = MappingProxyType(
    {
        "faithful": faithful,
        "timestamped": timestamped,
        "reordered-tools": reordered_tools,
        "reserialized-args": reserialized_args,
        "dropped-reasoning": dropped_reasoning,
        "mixed": mixed,
        "client-trim": client_trim,
        "varied-clocks": varied_clocks,
    }
)


def select(name: str, *, trim_tokens: int | None = None) -> Profile:
    """Profile ``name``; ``trim_tokens`` sets the budget of ``client-trim``;
    ``clock:FORMAT:POSITION`` one varied-clocks combination (CLOCK_FORMATS, CLOCK_POSITIONS;
    an empty part: chosen per conversation)."""
    if name == "client-trim" and trim_tokens is not None:
        return ClientTrim(trim_tokens)
    if name.startswith("clock:"):
        _, form, position = [*name.split(":"), "", ""][:3]
        if (form and form not in CLOCK_FORMATS) or (position and position not in CLOCK_POSITIONS):
            raise KeyError(name)
        return VariedClock(form or None, position or None)
    return PROFILES[name]


def notes(name: str, conversations: Iterable[Conversation]) -> list[str]:
    """What a user should know about running profile ``name`` on these conversations."""
    if name not in ("dropped-reasoning", "mixed"):
        return []
    has_reasoning = any(
        field in message
        for conversation in conversations
        for message in conversation.messages
        if message.get("role") == "assistant"
        for field in REASONING_FIELDS
    )
    if has_reasoning:
        return []
    return [f"{name}: these conversations carry no reasoning, so dropping it changes nothing"]
