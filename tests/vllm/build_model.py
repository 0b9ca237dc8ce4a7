"""Build a tiny random-weights Qwen2-style chat model and its tokenizer, for vLLM tests."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import model_cache  # beside this script

# Heavy imports happen inside the builders, so the "already built" check is instant.
if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

# Qwen2.5-Instruct's ChatML template with Hermes-style tools; `or ''` guards null contents.
TEMPLATE = Path(__file__).with_name("qwen2_chat_template.jinja")
MARKER = model_cache.MARKER
SEED = 0
VOCAB_SIZE = 8192
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not special, so decoding with skip_special_tokens keeps them (Qwen2.5 does too).
PLAIN_ADDED_TOKENS = ["<tool_call>", "</tool_call>"]
CORPUS_BYTES = 4_000_000
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _corpus() -> Iterator[str]:
    """Python's own stdlib sources, in a fixed order, up to CORPUS_BYTES."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib"}
    files = sorted(p for p in stdlib.rglob("*.py") if not skip & set(p.relative_to(stdlib).parts))
    total = 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        yield text
        total += len(text)
        if total >= CORPUS_BYTES:
            return


def build_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    # The same pipeline as transformers' Qwen2Tokenizer, which v5 rebuilds on load for any
    # qwen2 model whatever tokenizer.json says: then every reader tokenizes alike.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(PLAIN_ADDED_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=TEMPLATE.read_text(),
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )


def build_model(tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        dtype="float32",
    )
    torch.manual_seed(SEED)
    return Qwen2ForCausalLM(config).to(torch.float32).eval()


def build_id() -> str:
    """Changes whenever this script or the template does, so stale builds get rebuilt."""
    digest = hashlib.sha256(Path(__file__).read_bytes() + TEMPLATE.read_bytes())
    return "tiny-qwen2 " + digest.hexdigest()[:16]


def build(out: Path) -> None:
    from transformers import GenerationConfig

    tokenizer = build_tokenizer()
    if len(tokenizer) != VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {len(tokenizer)} tokens, expected {VOCAB_SIZE}")
    model = build_model(tokenizer)
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=eos, pad_token_id=eos[1]
    )
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        # chat_template inside tokenizer_config.json (not chat_template.jinja) and the class
        # real Qwen2.5 repos name, for readers other than vLLM.
        tokenizer.save_pretrained(tmp, save_jinja_files=False)
        config_path = tmp / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["tokenizer_class"] = "Qwen2Tokenizer"
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        for path in tmp.iterdir():
            path.chmod(0o644)
        tmp.chmod(0o755)
        (tmp / MARKER).write_text(build_id() + "\n")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    default = Path.home() / ".cache/prefill-proxy/models/tiny-qwen2"
    return model_cache.main("build-model", default, build, build_id, __doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
