from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import tokens
from proxy.replay import traces


def test_provision_writes_files_tiktoken_accepts(tmp_path: Path) -> None:
    folder = tokens.provision(tmp_path / "tk")
    for name, sha256 in tokens.ENCODINGS.items():
        data = (folder / tokens._cache_name(name)).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha256
    import tiktoken

    encoding = tiktoken.get_encoding("o200k_base")  # reads the provisioned file, offline
    assert len(encoding.encode("The quick brown fox jumps over the lazy dog.")) == 10


def test_provision_is_idempotent(tmp_path: Path) -> None:
    first = tokens.provision(tmp_path)
    stamp = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    tokens.provision(tmp_path)
    assert {p.name: p.stat().st_mtime_ns for p in first.iterdir()} == stamp


def test_missing_encoding_falls_back_to_the_estimate() -> None:
    counter = tokens.counter("no_such_encoding")
    assert isinstance(counter, tokens.Estimate)
    assert counter.count("x" * 9) == 3


def test_a_tool_list_is_counted_once_however_often_it_is_sent() -> None:
    from proxy.compaction.budget import Sizer

    class Counting:
        def __init__(self) -> None:
            self.texts: list[str] = []

        def count(self, text: str) -> int:
            self.texts.append(text)
            return len(text) // 4

    counter = Counting()
    sizer = Sizer(counter)
    tools = [
        {"type": "function", "function": {"name": f"t{n}", "parameters": {}}} for n in range(3)
    ]
    first = sizer.tools(tools)
    again = [sizer.tools(json_copy(tools)) for _ in range(5)]
    assert again == [first] * 5 and len(counter.texts) == 1
    assert sizer.tools(tools[:2]) != first and len(counter.texts) == 2  # another list: counted
    assert sizer.tools([]) == 0


def json_copy(value):  # a client's next request: equal content, new objects
    import json

    return json.loads(json.dumps(value))


@functools.cache
def tiktoken_count(name: str):
    import tiktoken

    tokens.provision()
    encoding = tiktoken.get_encoding(name)
    return lambda text: len(encoding.encode(text, disallowed_special=()))


def dev_texts() -> list[str]:
    """What the proxy counts on the dev traces: contents, tool calls, tool lists."""
    texts = []
    for conversation in traces.load(traces.locate("dev")):
        texts.append(json.dumps(conversation.tools))
        for message in conversation.messages:
            if isinstance(message.get("content"), str):
                texts.append(message["content"])
            if message.get("tool_calls"):
                texts.append(json.dumps(message["tool_calls"]))
    return texts


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_the_fast_counter_counts_as_tiktoken_does_on_the_dev_traces(name: str) -> None:
    counter = tokens.counter(name)
    assert isinstance(counter, tokens.Bpe)
    expected = tiktoken_count(name)
    texts = dev_texts()
    assert len(texts) > 1000
    assert [counter.count(text) for text in texts] == [expected(text) for text in texts]


# Text as a JSON body can carry it (no lone surrogates), weighted towards what tokenizers
# find hard: digits, punctuation and spaces runs, non-Latin scripts, emoji, special tokens.
TEXT = st.lists(
    st.one_of(
        st.text(st.characters(exclude_categories=["Cs"]), max_size=40),
        st.sampled_from(["<|endoftext|>", "<|fim_prefix|>", "  \n\n\t", "1234567", "'s", "🌤️"]),
        st.text('{}[]":, 0123456789abcXYZ\n', max_size=60),
    ),
    max_size=12,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(TEXT, st.sampled_from(["o200k_base", "cl100k_base"]))
def test_the_fast_counter_counts_as_tiktoken_does_on_any_text(text: str, name: str) -> None:
    assert tokens.counter(name).count(text) == tiktoken_count(name)(text)


def test_the_encoding_is_built_once_in_a_thread_when_first_needed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built_in: list[int] = []
    build = tokens.counter

    def counted(encoding: str = tokens.DEFAULT_ENCODING) -> tokens.Counter:
        built_in.append(threading.get_ident())
        return build(encoding)

    monkeypatch.setattr(tokens, "counter", counted)
    lazy = tokens.Lazy()
    assert not lazy.loaded

    async def two_requests_at_once() -> None:
        await asyncio.gather(lazy.load(), lazy.load())
        await lazy.load()

    asyncio.run(two_requests_at_once())
    assert lazy.loaded and len(built_in) == 1
    assert built_in[0] != threading.get_ident()  # not on the event loop's thread
    assert lazy.count("hello world") == build().count("hello world")
