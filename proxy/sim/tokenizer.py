"""Tokenizers for the simulator: tiktoken o200k_base with ChatML markers, or a model's
``tokenizer.json`` (HF ``tokenizers``, imported only when asked for).

Both encode a rendered chat prompt the way vLLM does: special and added tokens written
in the text are recognised, and nothing is added around it (``add_special_tokens=False``).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from proxy import tokens as token_counts

# gpt-4o's chat markers. o200k_base itself has no <|im_start|>/<|im_end|>: they are added
# as specials the way tiktoken's README extends an encoding ("Extending tiktoken").
CHATML_SPECIALS = {"<|im_start|>": 200264, "<|im_end|>": 200265}
CHATML_EOS = "<|im_end|>"


class TokenizerError(RuntimeError):
    """The tokenizer could not be loaded."""


class Tokenizer(Protocol):
    name: str
    eos_token: str
    # Strings the tokenizer always cuts out as single tokens (boundaries for BPE).
    markers: tuple[str, ...]
    # Variables HF's apply_chat_template passes to templates (bos_token, eos_token, ...).
    template_vars: dict[str, str]

    def encode(self, text: str) -> list[int]: ...

    def encode_prompt(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def pieces(self, text: str) -> list[str]: ...

    def token_strs(self, ids: Sequence[int]) -> list[str]: ...


class TiktokenTokenizer:
    def __init__(self, encoding: Any) -> None:
        self._encoding = encoding
        self.name = encoding.name
        self.eos_token = CHATML_EOS
        self.markers = tuple(encoding.special_tokens_set)
        self.template_vars = {"eos_token": CHATML_EOS}

    @classmethod
    def chatml_o200k(cls) -> TiktokenTokenizer:
        import tiktoken

        token_counts.provision()
        try:
            base = tiktoken.get_encoding(token_counts.DEFAULT_ENCODING)
        except Exception as exc:  # tiktoken raises bare Exception kinds when offline
            name = token_counts.DEFAULT_ENCODING
            raise TokenizerError(f"cannot load tiktoken {name}: {exc}") from exc
        encoding = tiktoken.Encoding(
            name="o200k_chatml",
            pat_str=base._pat_str,
            mergeable_ranks=base._mergeable_ranks,
            special_tokens={**base._special_tokens, **CHATML_SPECIALS},
        )
        return cls(encoding)

    def encode(self, text: str) -> list[int]:
        return list(self._encoding.encode(text, allowed_special="all"))

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._encoding.decode(list(ids)))

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        return [self._encoding.decode_single_token_bytes(i).decode("utf-8", "replace") for i in ids]

    def pieces(self, text: str) -> list[str]:
        """``text`` cut where its tokens end; a character split over tokens goes whole
        to the token that completes it."""
        decoder = codecs.getincrementaldecoder("utf-8")()
        out = []
        for token in self.encode(text):
            piece = decoder.decode(self._encoding.decode_single_token_bytes(token))
            if piece:
                out.append(piece)
        return out


class HFTokenizer:
    """A model folder's ``tokenizer.json`` and the special tokens of its config."""

    def __init__(self, folder: Path) -> None:
        try:
            from tokenizers import Tokenizer as Backend
        except ImportError as exc:
            raise TokenizerError(
                "--tokenizer needs the 'tokenizers' package: pip install 'prefill-proxy[test]'"
            ) from exc
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"no tokenizer.json in {folder}")
        self._backend = Backend.from_file(str(path))
        self.name = folder.name
        self.config = read_tokenizer_config(folder)
        self.template_vars = {
            key: _token_text(self.config[key])
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
            if self.config.get(key) is not None
        }
        self.eos_token = self.template_vars.get("eos_token", "")
        added = self._backend.get_added_tokens_decoder().values()
        self.markers = tuple(token.content for token in added)

    def encode(self, text: str) -> list[int]:
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    def encode_prompt(self, text: str) -> list[int]:
        return list(self._backend.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._backend.decode(list(ids), skip_special_tokens=False))

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        return [self._backend.id_to_token(i) or "" for i in ids]

    def pieces(self, text: str) -> list[str]:
        out = []
        end = 0
        for _, stop in self._backend.encode(text, add_special_tokens=False).offsets:
            if stop > end:
                out.append(text[end:stop])
                end = stop
        if end < len(text):
            if out:
                out[-1] += text[end:]
            else:
                out.append(text[end:])
        return out


def _token_text(value: Any) -> str:
    return str(value.get("content", "")) if isinstance(value, dict) else str(value)


def read_tokenizer_config(folder: Path) -> dict[str, Any]:
    path = folder / "tokenizer_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot read {path}: {exc}") from exc
    return config if isinstance(config, dict) else {}


def load_tokenizer(folder: str | Path | None) -> Tokenizer:
    if folder is None or folder == "":
        return TiktokenTokenizer.chatml_o200k()
    return HFTokenizer(Path(folder).expanduser())
