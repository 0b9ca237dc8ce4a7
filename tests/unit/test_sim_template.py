"""The simulator's prompt side: vLLM's message normalisation, HF-style rendering, tokenizers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from proxy.sim.conversation import InvalidConversation, normalize_messages, normalize_tools
from proxy.sim.prompt import PromptBuilder
from proxy.sim.reply import Reply, plan, synthetic_tokens
from proxy.sim.template import ChatRenderer, TemplateError, template_source
from proxy.sim.tokenizer import HFTokenizer, TiktokenTokenizer, Tokenizer, TokenizerError

TINY_QWEN2 = Path.home() / ".cache" / "prefill-proxy" / "models" / "tiny-qwen2"
needs_tiny_qwen2 = pytest.mark.skipif(
    not (TINY_QWEN2 / "tokenizer.json").is_file() or importlib.util.find_spec("tokenizers") is None,
    reason="needs the real-vLLM test model (tests/vllm/build_model.py) and 'tokenizers'",
)
TOOL = {"type": "function", "function": {"parameters": {"type": "object"}, "name": "f", "x": 1}}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1,"b":"é"}'}}


@pytest.fixture(scope="module")
def o200k() -> TiktokenTokenizer:
    return TiktokenTokenizer.chatml_o200k()


@pytest.fixture(scope="module")
def builder(o200k) -> PromptBuilder:
    return PromptBuilder(ChatRenderer(template_source(None), o200k.template_vars), o200k)


def test_messages_are_normalised_as_vllm_does() -> None:
    messages = normalize_messages(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None, "tool_calls": [CALL], "extra": 1},
            {"role": "assistant", "content": "x", "tool_calls": []},
            {"role": "tool", "tool_call_id": "c1", "content": "r", "name": "f"},
            {
                "role": "assistant",
                "content": "y",
                "tool_calls": [{"function": {"name": "g", "arguments": "not json"}}],
            },
        ]
    )
    assert messages[0] == {"role": "user", "content": "a\nb"}
    assert messages[1]["content"] == "" and "extra" not in messages[1]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1, "b": "é"}
    assert CALL["function"]["arguments"] == '{"a":1,"b":"é"}'  # the request is not mutated
    assert "tool_calls" not in messages[2]
    assert messages[3] == {"role": "tool", "content": "r", "name": "f", "tool_call_id": "c1"}
    assert messages[4]["tool_calls"][0]["function"]["arguments"] == {}
    with pytest.raises(InvalidConversation):
        normalize_messages([{"content": "no role"}])


def test_tools_are_rebuilt_in_vllms_key_order_with_nulls() -> None:
    assert normalize_tools([TOOL]) == [
        {
            "type": "function",
            "function": {"name": "f", "description": None, "parameters": {"type": "object"}},
        }
    ]
    assert normalize_tools(None) is None
    with pytest.raises(InvalidConversation):
        normalize_tools([{"type": "function"}])


def test_default_template_renders_chatml_with_tools_and_tojson_arguments(builder) -> None:
    prompt = builder.chat(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
        ],
        [TOOL],
        add_generation_prompt=True,
    )
    assert prompt.text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")
    assert '{"type": "function", "function": {"name": "f", "description": null' in prompt.text
    assert (
        '<tool_call>\n{"name": "f", "arguments": {"a": 1, "b": "é"}}\n</tool_call>' in prompt.text
    )
    assert prompt.text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.tokens.count(200264) == 4  # <|im_start|> is one special token


def test_template_errors_surface_as_template_errors(o200k) -> None:
    renderer = ChatRenderer("{{ raise_exception('no system role') }}", o200k.template_vars)
    with pytest.raises(TemplateError, match="no system role"):
        renderer.render([], None, add_generation_prompt=True)


def test_continue_final_message_ends_the_prompt_inside_the_last_message(builder) -> None:
    prompt = builder.chat(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Summary: the"}],
        continue_final_message=True,
    )
    assert prompt.text.endswith("<|im_start|>assistant\nSummary: the")


def test_answer_tokens_are_what_the_next_prompt_renders(builder, o200k) -> None:
    history = [{"role": "user", "content": "weather?"}]
    prompt = builder.chat(history, [TOOL])
    answer = Reply("Let me look.", ())
    tokens = builder.answer_tokens(prompt, answer.message())
    assert tokens[-1] == 200265  # ends with <|im_end|>, without the newline after it
    following = builder.chat([*history, answer.message()], [TOOL], add_generation_prompt=False)
    assert following.tokens[: len(prompt.tokens) + len(tokens)] == prompt.tokens + tokens
    assert o200k.decode(tokens) == "Let me look.<|im_end|>"


@pytest.mark.parametrize("text", ["plain words", "naïve café 東京 🌞 emoji", "\n\n  spaced\t"])
def test_pieces_are_the_text_cut_at_token_ends(o200k, text) -> None:
    pieces = o200k.pieces(text)
    assert "".join(pieces) == text
    assert len(pieces) <= len(o200k.encode(text))


def test_plan_spreads_deltas_and_cuts_at_max_tokens(o200k) -> None:
    reply = Reply("abc def", ())
    full = plan(reply, [1, 2, 3, 4], o200k, max_tokens=10)
    assert full.finish_reason == "stop" and full.deltas[-1] == []
    assert full.message() == {"content": "abc def"}
    cut = plan(reply, [1, 2, 3, 4], o200k, max_tokens=1)
    assert cut.finish_reason == "length" and cut.tokens == [1]
    assert cut.message() == {"content": "abc"}
    crowded = plan(Reply("a b c d e f g h", ()), [1, 2, 3], o200k, max_tokens=10)
    assert "".join(d["content"] for per in crowded.deltas for d in per) == "a b c d e f g h"


def test_synthetic_tokens_have_the_asked_length(o200k) -> None:
    assert len(synthetic_tokens([1, 2, 3], o200k, 37)) == 37
    assert synthetic_tokens([1, 2, 3], o200k, 5) == synthetic_tokens([1, 2, 3], o200k, 5)
    assert synthetic_tokens([1, 2, 3], o200k, 0) == []


def test_a_missing_tokenizer_folder_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        HFTokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="no chat template"):
        template_source(tmp_path)


def test_without_the_tokenizers_package_the_error_says_what_to_install(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes the import fail
    with pytest.raises(TokenizerError, match="needs the 'tokenizers' package"):
        HFTokenizer(tmp_path)


@needs_tiny_qwen2
def test_tiny_qwen2_tokens_equal_what_vllm_returned() -> None:
    """Token ids recorded from vLLM 0.32's /tokenize serving this model."""
    tokenizer: Tokenizer = HFTokenizer(TINY_QWEN2)
    renderer = ChatRenderer(template_source(TINY_QWEN2), tokenizer.template_vars)
    builder = PromptBuilder(renderer, tokenizer)
    prompt = builder.chat([{"role": "user", "content": "hi"}])
    assert prompt.tokens == [
        1, 85, 2111, 201, 59, 1434, 648, 1613, 89, 483, 14, 2928, 543, 360, 527, 837, 67, 323,
        339, 87, 70, 16, 7484, 648, 271, 1598, 2250, 2013, 697, 1041, 16, 2, 201, 1, 2330, 201,
        1866, 2, 201, 1, 3199, 697, 1041, 201,
    ]  # fmt: skip
    assert tokenizer.encode_prompt("hello world") == [277, 78, 339, 4701, 539]
    text = "naïve café 東京 🌞"
    assert "".join(tokenizer.pieces(text)) == text
    answer = builder.answer_tokens(prompt, {"role": "assistant", "content": "Hello."})
    assert tokenizer.decode(answer).endswith("Hello.<|im_end|>")
