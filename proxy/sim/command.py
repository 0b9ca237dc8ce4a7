"""``prefill-proxy sim``: serve the vLLM-like simulator. Imports stay light: the CLI loads
this module to build its parser; the server's dependencies load only in ``run``."""

from __future__ import annotations

import argparse
import dataclasses
import logging

from proxy.sim.config import DEFAULT_MAX_MODEL_LEN, SimConfig
from proxy.sim.timing import CostModel

EPILOG = """\
Defaults model Llama-3.1-8B-Instruct (bf16) on one NVIDIA H100 SXM 80GB under vLLM, from
public figures (model config.json; H100 datasheet: 989 TFLOPS bf16, 3.35 TB/s):
  prefill  ~22k tokens/s at short context (4.5e-5 s/token), slower as attention grows
           (1.3e-9 s per query x context token pair): ~15k tokens/s at 32k
  decode   ~6.5 ms per step at small batch: weights read once per step (6.0e-3 s) plus
           4.9e-8 s per context token read (128 KiB of KV per token), +0.5 ms overhead
  KV cache 400k tokens (~54 GB); 8192 tokens and 1024 sequences per step (vLLM defaults)
A step costs overhead + max(compute, memory). Sources and derivation: proxy/sim/timing.py.

Replay extension: a request's "x_replay_reply" (an OpenAI assistant message) is answered
exactly; otherwise the answer is synthetic (--reply-tokens long, hash of the prompt).
"""

_TIMING_FLAGS = {
    "prefill_token_s": "compute seconds per token in a step (weights)",
    "attention_pair_s": "compute seconds per (query token, context token) attention pair",
    "weights_read_s": "memory seconds per step for reading the weights (decode floor)",
    "kv_read_token_s": "memory seconds per context token read in a step",
    "step_overhead_s": "fixed seconds per step (scheduling, sampling)",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    defaults = SimConfig()
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    add("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    add(
        "--model-name",
        "--served-model-name",
        dest="model_name",
        default=defaults.model_name,
        help="model name served and expected in requests (default: %(default)s)",
    )
    add(
        "--tokenizer",
        metavar="DIR",
        default=None,
        help="a HF model folder: its tokenizer.json and chat template (needs the "
        "'tokenizers' package); default: tiktoken o200k_base and a ChatML+tools template",
    )
    add(
        "--max-model-len",
        type=int,
        default=None,
        help=f"context length (default: {DEFAULT_MAX_MODEL_LEN}, capped to the KV capacity)",
    )
    add(
        "--block-size",
        type=int,
        default=defaults.block_size,
        help="tokens per KV block (default: %(default)s)",
    )
    add(
        "--capacity-tokens",
        type=int,
        default=defaults.capacity_tokens,
        help="KV cache size in tokens (default: %(default)s)",
    )
    add(
        "--max-num-batched-tokens",
        type=int,
        default=defaults.max_num_batched_tokens,
        help="token budget per step, chunked prefill included (default: %(default)s)",
    )
    add(
        "--max-num-seqs",
        type=int,
        default=defaults.max_num_seqs,
        help="sequences running at once (default: %(default)s)",
    )
    add(
        "--speed",
        type=float,
        default=defaults.speed,
        help="run this many times faster than the modelled GPU (default: %(default)s)",
    )
    add(
        "--reply-tokens",
        type=int,
        default=defaults.reply_tokens,
        help="length of a synthetic answer in tokens (default: %(default)s)",
    )
    cost = CostModel()
    for name, text in _TIMING_FLAGS.items():
        add(
            "--" + name.replace("_", "-"),
            type=float,
            default=getattr(cost, name),
            help=f"{text} (default: %(default)s)",
        )
    add(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default: %(default)s)",
    )


def config_from(args: argparse.Namespace) -> SimConfig:
    max_model_len = args.max_model_len
    if max_model_len is None:
        max_model_len = min(
            DEFAULT_MAX_MODEL_LEN, args.capacity_tokens // args.block_size * args.block_size
        )
    cost = CostModel(**{name: getattr(args, name) for name in _TIMING_FLAGS})
    return SimConfig(
        model_name=args.model_name,
        max_model_len=max_model_len,
        block_size=args.block_size,
        capacity_tokens=args.capacity_tokens,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        speed=args.speed,
        tokenizer=args.tokenizer,
        reply_tokens=args.reply_tokens,
        cost=cost,
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from proxy.cli import setup_logging

    try:
        from proxy.sim.app import create_sim_app
        from proxy.sim.tokenizer import TokenizerError
    except ModuleNotFoundError as exc:  # the serving package alone: no simulator extra
        raise SystemExit(
            f"prefill-proxy sim needs the 'sim' extra ({exc.name} is missing): "
            "pip install 'prefill-proxy[sim]'"
        ) from None

    try:
        config = config_from(args)
        app = create_sim_app(config)
    except (ValueError, TokenizerError) as exc:
        raise SystemExit(f"prefill-proxy sim: {exc}") from None
    setup_logging(args.log_level)
    summary = {k: v for k, v in dataclasses.asdict(config).items() if k != "cost"}
    logging.getLogger("prefill_proxy.sim").info(
        "simulator on http://%s:%d %s", args.host, args.port, summary
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level=args.log_level,
        access_log=False,
        timeout_keep_alive=65,
    )
    return 0
