from __future__ import annotations

import hashlib
from pathlib import Path

from proxy import tokens


def test_provision_writes_files_tiktoken_accepts(tmp_path: Path) -> None:
    folder = tokens.provision(tmp_path / "tk")
    for name, sha256 in tokens.ENCODINGS.items():
        data = (folder / tokens._cache_name(name)).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha256
    counter = tokens.counter("o200k_base")
    assert isinstance(counter, tokens.Tiktoken)
    assert counter.count("The quick brown fox jumps over the lazy dog.") == 10


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
