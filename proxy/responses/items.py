"""A Responses API request as a chat conversation, and back. Pure functions; no I/O.

The proxy's rewrites, sessions, compaction and warm-up work on one model of a
conversation: chat-completion messages. A ``/v1/responses`` request is read into that
model (``to_chat``) and the conversation the pipeline made of it written back
(``to_responses``), so one copy of each transform serves both wire formats. The mapping
is vLLM's own (its Responses route renders input items as these chat messages):
``instructions`` and system/developer items are system messages, user items user
messages, the items of one assistant turn (reasoning, text, function calls) one assistant
message with ``tool_calls``, a ``function_call_output`` a tool message.

Nothing is lost on the way back: each message made from items carries them under
``SOURCE``; a message the pipeline left as it was goes back as exactly those items, and
a changed one is written into them (a user item with a note appended keeps its type, id
and part types). A reply is recorded the same way, carrying its output items as emitted,
so restoring it (proxy.rewrite.restore) forwards the emitted items byte for byte,
reasoning included, whatever the client sent back. Items the model does not know (built-
in tool calls, item references) are kept in place as messages of role ``OPAQUE`` that
every transform passes over.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from proxy import jsonio
from proxy.scans import same_objects

SOURCE = "prefill_proxy_items"  # a message's items, as sent or as emitted
INSTRUCTIONS = "instructions"  # SOURCE of the message made from ``instructions``
STRING_INPUT = "input"  # SOURCE of the user message made from a string ``input``
OPAQUE = "item"  # role of a message that stands for an item the mapping does not read
ASSISTANT_ITEMS = frozenset({"reasoning", "function_call"})
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
# Request fields that are the conversation; the rest go upstream as the client sent them.
CONVERSATION_FIELDS = ("instructions", "input", "tools", "parallel_tool_calls")


class NotAConversation(ValueError):
    """A request whose input the mapping cannot read (the engine judges it, unchanged)."""


# -- requests ------------------------------------------------------------------------------


Converted = dict[int, tuple[Any, dict[str, Any]]]


def to_chat(request: Mapping[str, Any], converted: Converted | None = None) -> dict[str, Any]:
    """The chat-completion request standing for a Responses request: its messages, tools
    and ``parallel_tool_calls``, and the fields sessions are identified by. ``converted``:
    messages made before (proxy.known.Known, carried with a body the next step
    continues), by the id of the object they were made from; a message made again from
    the same objects is the same object, so the session's chains carry over it. Made
    messages are never changed in place (the rewrites replace them)."""
    made: Converted = {} if converted is None else converted
    messages: list[dict[str, Any]] = []
    instructions = request.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append(_made(made, instructions, (instructions,), _instructions))
    elif instructions is not None and not isinstance(instructions, str):
        raise NotAConversation("instructions is not a string")
    given = request.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given, SOURCE: STRING_INPUT})
    elif isinstance(given, list):
        messages.extend(_messages(given, made))
    else:
        raise NotAConversation("input is neither a string nor a list of items")
    chat: dict[str, Any] = {"model": request.get("model"), "messages": messages}
    tools = request.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise NotAConversation("tools is not a list")
        chat["tools"] = [chat_tool(tool) for tool in tools]
    for field in ("parallel_tool_calls", "user", "prompt_cache_key", "stream"):
        if field in request:
            chat[field] = request[field]
    return chat


def to_responses(
    original: dict[str, Any], chat: Mapping[str, Any], read: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``original`` with its conversation replaced by ``chat``'s (what the pipeline made
    of ``read``, which is ``to_chat(original)``): ``original`` itself when nothing changed.
    Sameness is exact (the bytes the engine renders), never Python's ``==``, which is blind
    to key order; the pipeline's untouched messages are the very objects it was given."""
    read = to_chat(original) if read is None else read
    messages = chat.get("messages") or []
    tools = chat.get("tools")
    same_messages = same(messages, read.get("messages"))
    same_tools = same(tools, read.get("tools"))
    parallel = chat.get("parallel_tool_calls")
    if same_messages and same_tools and same(parallel, original.get("parallel_tool_calls")):
        return original
    forwarded = dict(original)
    if not same_messages:
        forwarded.pop("instructions", None)
        untouched = {id(message) for message in read.get("messages") or ()}
        instructions, forwarded["input"] = _items(messages, original, untouched)
        if instructions is not None:
            forwarded["instructions"] = instructions
    if not same_tools and isinstance(tools, list):
        forwarded["tools"] = [responses_tool(tool) for tool in tools]
    if "parallel_tool_calls" in chat:
        forwarded["parallel_tool_calls"] = parallel
    return _ordered(forwarded, original)


def same(a: Any, b: Any) -> bool:
    """Whether two parsed JSON values are the same bytes (key order included)."""
    if a is b:
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    try:
        return type(a) is type(b) and jsonio.dumps(a) == jsonio.dumps(b)
    except jsonio.InvalidJSON:
        return False


def _ordered(forwarded: dict[str, Any], original: Mapping[str, Any]) -> dict[str, Any]:
    """The client's field order, new fields after it (the body reads as the client's)."""
    ordered = {key: forwarded[key] for key in original if key in forwarded}
    ordered.update((key, value) for key, value in forwarded.items() if key not in ordered)
    return ordered


# -- items to messages ------------------------------------------------------------------


def _made(
    made: Converted, key: Any, sources: tuple[Any, ...], make: Callable[..., dict[str, Any]]
) -> dict[str, Any]:
    """``make(*sources)``, or the message it made from these very objects before (kept by
    the id of ``key``, the first of them: its entry holds them all alive)."""
    known = made.get(id(key))
    if known is not None and same_objects(known[0], sources):
        return known[1]
    message = make(*sources)
    made[id(key)] = (sources, message)
    return message


def _instructions(instructions: str) -> dict[str, Any]:
    return {"role": "system", "content": instructions, SOURCE: INSTRUCTIONS}


def _messages(items: Sequence[Any], made: Converted) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    turn: list[dict[str, Any]] = []  # the items of the assistant turn being read
    for item in items:
        if not isinstance(item, dict):
            raise NotAConversation("an input item is not an object")
        if is_assistant_item(item):
            if turn and _starts_turn(item, turn):
                messages.append(_made(made, turn[0], tuple(turn), _assistant_turn))
                turn = []
            turn.append(item)
            continue
        if turn:
            messages.append(_made(made, turn[0], tuple(turn), _assistant_turn))
            turn = []
        messages.append(_made(made, item, (item,), _message))
    if turn:
        messages.append(_made(made, turn[0], tuple(turn), _assistant_turn))
    return messages


def _assistant_turn(*items: dict[str, Any]) -> dict[str, Any]:
    return assistant_message(items)


def is_assistant_item(item: Mapping[str, Any]) -> bool:
    kind = item.get("type")
    if kind in ASSISTANT_ITEMS:
        return True
    return kind in (None, "message") and item.get("role") == "assistant"


def _starts_turn(item: Mapping[str, Any], turn: Sequence[Mapping[str, Any]]) -> bool:
    """An assistant turn is reasoning, then text, then calls: text or reasoning after a
    call begins the next turn (vLLM renders such items as separate messages too)."""
    return item.get("type") != "function_call" and any(
        done.get("type") == "function_call" for done in turn
    )


def _message(item: dict[str, Any]) -> dict[str, Any]:
    kind, role = item.get("type"), item.get("role")
    if kind == "function_call_output":
        output = item.get("output")
        content = chat_content(output) if isinstance(output, list) else output
        return {
            "role": "tool",
            "tool_call_id": item.get("call_id"),
            "content": content,
            SOURCE: [item],
        }
    if kind in (None, "message") and role in ("user", "system", "developer"):
        return {"role": role, "content": chat_content(item.get("content")), SOURCE: [item]}
    # Read as text by the keys, so two different items never share one.
    return {"role": OPAQUE, "content": jsonio.dumps_canonical(item).decode(), SOURCE: [item]}


def assistant_message(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One assistant turn's items (as sent back, or a reply's output as emitted) as one
    chat message."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in items:
        if item.get("type") == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                }
            )
        elif item.get("type") != "reasoning":
            texts.extend(_texts(item.get("content")))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    message[SOURCE] = list(items)
    return message


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [
        part["text"]
        for part in content
        if isinstance(part, dict)
        and part.get("type") in TEXT_PARTS
        and isinstance(part.get("text"), str)
    ]


def chat_content(content: Any) -> Any:
    """Responses content (a string, or parts) as chat content: text parts of any kind as
    ``text`` parts (the rewrites read those), other parts as they are."""
    if not isinstance(content, list):
        return content
    return [
        {"type": "text", "text": part["text"]}
        if isinstance(part, dict)
        and part.get("type") in TEXT_PARTS
        and isinstance(part.get("text"), str)
        else part
        for part in content
    ]


# -- messages to items ------------------------------------------------------------------


def _items(
    messages: Sequence[Any], original: Mapping[str, Any], untouched: set[int]
) -> tuple[str | None, Any]:
    """(instructions, input) for the pipeline's messages; ``untouched``: the ids of the
    messages read from the request, which the pipeline passes on as the same objects
    (their items go back as they came, without a comparison)."""
    instructions: str | None = None
    items: list[Any] = []
    for message in messages:
        source = message.get(SOURCE) if isinstance(message, dict) else None
        if id(message) in untouched and isinstance(source, list):
            items.extend(source)
        elif source == INSTRUCTIONS and isinstance(message.get("content"), str):
            instructions = message["content"]
        elif source == STRING_INPUT and isinstance(original.get("input"), str):
            items.append({"role": "user", "content": message.get("content")})
        else:
            items.extend(message_items(message))
    if isinstance(original.get("input"), str) and len(items) == 1:
        only = items[0]
        if set(only) == {"role", "content"} and isinstance(only["content"], str):
            return instructions, only["content"]  # a string input stays a string
    return instructions, items


def message_items(message: Any) -> list[Any]:
    """The items a chat message stands for: its source items when it is still what they
    say, else those items with the message's change written in, else new items."""
    if not isinstance(message, dict):
        return [message]
    source = message.get(SOURCE)
    if isinstance(source, list) and source:
        if message.get("role") == OPAQUE:  # nothing reads it, so nothing changed it
            return list(source)
        if same(_without_source(message), _without_source(_read_back(source))):
            return list(source)
        changed = _written_into(message, source)
        if changed is not None:
            return changed
    return _new_items(message)


def _read_back(source: list[dict[str, Any]]) -> dict[str, Any]:
    if is_assistant_item(source[0]):
        return assistant_message(source)
    return _message(source[0])


def _without_source(message: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in message.items() if key != SOURCE}


def _written_into(message: dict[str, Any], source: list[dict[str, Any]]) -> list[Any] | None:
    """A user, system, developer or tool message whose content changed (a note added, a
    restoration): its one item with the new content, in the item's own part types."""
    if len(source) != 1 or message.get("role") == "assistant":
        return None
    item = source[0]
    content = message.get("content")
    if item.get("type") == "function_call_output":
        original = item.get("output")
        output = responses_content(content, original) if isinstance(content, list) else content
        return [{**item, "output": output}]
    if message.get("role") == item.get("role"):
        return [{**item, "content": responses_content(content, item.get("content"))}]
    return None


def _new_items(message: dict[str, Any]) -> list[Any]:
    """Items for a message the pipeline made (a compaction stand-in) or changed past
    writing back into its items."""
    role = message.get("role")
    content = message.get("content")
    if role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": message.get("tool_call_id"),
                "output": responses_content(content, None)
                if isinstance(content, list)
                else content,
            }
        ]
    if role == "assistant":
        items: list[Any] = []
        if content:
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "".join(_texts(content))}],
                }
            )
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": function.get("arguments"),
                    }
                )
        return items
    return [{"type": "message", "role": role, "content": responses_content(content, None)}]


def responses_content(content: Any, like: Any) -> Any:
    """Chat content back as Responses content: ``text`` parts as the part type ``like``
    (the item's content as it was) used, ``input_text`` if it used none."""
    if not isinstance(content, list):
        return content
    kinds = [p["type"] for p in like or () if isinstance(p, dict) and p.get("type") in TEXT_PARTS]
    kind = str(kinds[0]) if isinstance(like, list) and kinds else "input_text"
    return [
        {"type": kind, "text": part["text"]}
        if isinstance(part, dict) and part.get("type") == "text"
        else part
        for part in content
    ]


# -- tools --------------------------------------------------------------------------------


def chat_tool(tool: Any) -> Any:
    """A Responses function tool (flat: ``name``, ``parameters`` beside ``type``) as a chat
    tool; built-in tools (web search, MCP, ...) as they are."""
    if not isinstance(tool, dict) or tool.get("type") != "function" or "function" in tool:
        return tool
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def responses_tool(tool: Any) -> Any:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return tool
    function = tool.get("function")
    if not isinstance(function, dict) or set(tool) != {"type", "function"}:
        return tool
    return {"type": "function", **function}


def strip_sources(messages: Sequence[Any]) -> list[Any]:
    """Messages without their source items (for an engine's chat route: warm-ups,
    summaries)."""
    return [
        _without_source(message) if isinstance(message, dict) and SOURCE in message else message
        for message in messages
    ]
