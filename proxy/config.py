"""Settings: one frozen object, read from defaults < YAML file < environment < command line.

This is the only module that reads ``os.environ``. Every field carries its own help text,
so ``--help``, the environment names and the README table all come from one place.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

ENV_PREFIX = "PREFILL_PROXY_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"


class SettingsError(ValueError):
    """A setting has a value that cannot be used."""


def _setting(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class Settings:
    upstream: str = _setting(
        "http://127.0.0.1:8000",
        "Base URL of the OpenAI-compatible engine (vLLM); several, comma-separated, for a "
        "proxy in front of several engines (sessions stay on one: proxy/engines.py).",
    )
    upstream_dns_refresh: float = _setting(
        0.0,
        "Seconds between re-resolving the upstream's host name into one engine per address "
        "(a Kubernetes headless Service); 0: the URLs as given.",
    )
    engine_probe_interval: float = _setting(
        2.0, "Seconds between health probes of each engine (only with more than one)."
    )
    engine_placement: str = _setting(
        "prefix",
        "How a new session is placed among several engines: prefix (by its system prompt "
        "and tools, so conversations sharing them share KV blocks) or session (by its own "
        "key); either way by rendezvous hashing, with bounded loads (engine_spread_load).",
    )
    engine_spread_load: float = _setting(
        8.0,
        "Requests an engine may carry (running + waiting, from its /metrics, and this "
        "proxy's) before new sessions skip it for the next engine of their ranking, once it "
        "is also above 1.25x the engines' mean; 0: no bound.",
    )
    engine_max_waiting: float = _setting(
        0.0,
        "Skip an engine for new and moving sessions while its vllm:num_requests_waiting is "
        "above this (read from its /metrics at each probe); 0: never.",
    )
    upstream_session_header: str = _setting(
        "",
        "Send each chat request's session key upstream in this header, for a cache-aware "
        "router in front of the engines (README: which header each router reads); empty: "
        "not sent.",
    )
    upstream_affinity_header: str = _setting(
        "",
        "A router's affinity token: the value the upstream returns in this response header "
        "is kept with the session and sent back in it on the session's next requests "
        "(llm-d's session-affinity scorer: x-session-token); empty: none.",
    )
    host: str = _setting("127.0.0.1", "Address the proxy listens on.")
    port: int = _setting(8080, "Port the proxy listens on.")
    log_level: str = _setting("info", "Log level: debug, info, warning, error.")
    api_keys: tuple[str, ...] = _setting(
        (),
        "Keys clients must send (Authorization: Bearer KEY) when the proxy is the exposed "
        "edge; empty: no check (comma-separated in env and CLI). Compared in constant "
        "time, never logged.",
    )
    upstream_api_key: str = _setting(
        "",
        "Key sent to the upstream instead of the client's Authorization (for the proxy's "
        "own requests too); empty: the client's is forwarded.",
    )
    metrics_port: int = _setting(
        0, "Serve /metrics on this port only (not on the proxy's port); 0: on the proxy's port."
    )
    log_bodies: bool = _setting(
        False, "Log prompt and completion text (debugging only; off in production)."
    )
    max_body_bytes: int = _setting(
        16 * 1024 * 1024,
        "Largest request body accepted; larger ones get 413. A body holds the event loop "
        "about 3 ms per MB while it is parsed and rewritten (tests/benchmarks/big_body.py).",
    )
    body_cache_bytes: int = _setting(
        64 * 1024 * 1024,
        "Bytes of recent request bodies kept so that the next step of a conversation is "
        "parsed only from where it is new (proxy/bodies.py; their parsed messages take "
        "about as much again), for chat completions and for the Responses API each; 0: "
        "every body parsed whole.",
    )
    early_upload_bytes: int = _setting(
        0,
        "Requests at least this big that continue a kept body start going to the engine "
        "before the proxy has worked on them: what the conversation's last request forwarded "
        "up to the end of its messages, in chunked transfer encoding, checked against the "
        "request once built (dropped and sent again where it differs); 0: never (the "
        "default: on loopback it measured no faster, tests/benchmarks/README.md). Needs an "
        "engine and routers that take chunked request bodies (vLLM does); not with the "
        "upstream session or affinity header.",
    )
    max_sse_event_bytes: int = _setting(
        8 * 1024 * 1024,
        "Largest server-sent event accepted from the upstream; a stream with a longer one "
        "ends with an error event (upstream_broken).",
    )
    max_reply_chars: int = _setting(
        4 * 1024 * 1024,
        "Longest streamed reply (content, reasoning, tool-call arguments) kept for the "
        "session record; a longer one is not recorded (its history is forwarded as the "
        "client sends it) and is counted in prefill_proxy_replies_too_long_total.",
    )
    max_header_bytes: int = _setting(
        64 * 1024, "Largest request head (request line and headers); a larger one gets 431."
    )
    max_header_count: int = _setting(100, "Most request headers; more get 431.")
    head_timeout: float = _setting(
        30.0,
        "Seconds a client has to send a request head, from connecting or from its first "
        "byte; then 408 and the connection is closed.",
    )
    body_timeout: float = _setting(
        120.0, "Seconds a client has to send the body after its head; then 408 and close."
    )
    max_client_connections: int = _setting(
        4096, "Client connections at once; one more gets 503 and is closed."
    )
    shutdown_grace: int = _setting(
        25,
        "Seconds a SIGTERM waits for requests in flight, streams included, before ending "
        "the rest (a stream with an error event); keep it under Kubernetes' "
        "terminationGracePeriodSeconds (30 by default).",
    )
    connect_timeout: float = _setting(10.0, "Seconds to open a connection to the upstream.")
    read_timeout: float = _setting(
        600.0,
        "Seconds to wait for the next bytes from the upstream (a non-streamed reply "
        "arrives only when it is complete, so this bounds a whole non-stream request).",
    )
    total_timeout: float = _setting(
        3600.0, "Seconds a whole upstream exchange may take, streams included; 0 = no limit."
    )
    max_connections: int = _setting(
        2048, "Upstream connection pool size (one connection per concurrent stream)."
    )
    keepalive_expiry: float = _setting(
        4.0,
        "Seconds an idle upstream connection is kept; keep it under the upstream's own "
        "keep-alive (vLLM: 5 s) so the proxy never reuses a connection being closed.",
    )
    ready_path: str = _setting("/health", "Upstream path that /ready probes (vLLM serves /health).")
    rewrite: bool = _setting(
        True, "Apply the rewrite pipeline to /v1/chat/completions (false: pure passthrough)."
    )
    passthrough_paths: tuple[str, ...] = _setting(
        (),
        "Paths forwarded besides vLLM's OpenAI, token, model, version and health routes "
        "(proxy/paths.py), e.g. /reset_prefix_cache or /pooling/* (what is under it); * "
        "forwards every path. Others get 404 (comma-separated in env and CLI).",
    )
    disabled_rewrites: tuple[str, ...] = _setting(
        (), "Rewrite transforms to switch off, by name (comma-separated in env and CLI)."
    )
    sessions: bool = _setting(
        True,
        "Track conversations (needed by history restoration and prefix-break metrics).",
    )
    session_max: int = _setting(
        10_000,
        "Sessions kept (per process in memory; all replicas together in redis); the least "
        "recently used beyond this are dropped.",
    )
    session_ttl: float = _setting(3600.0, "Seconds an idle session is kept.")
    session_store: str = _setting(
        "memory",
        "Where session records live: memory (this process) or redis (shared by every "
        "replica: needed when more than one proxy serves the same conversations).",
    )
    redis_url: str = _setting(
        "redis://127.0.0.1:6379/0",
        "The Redis or Valkey server for session_store=redis: redis://, rediss:// (TLS) or "
        "unix:// (a password goes in the URL; never logged).",
    )
    session_store_timeout: float = _setting(
        0.1,
        "Seconds a request waits for the session store; then it goes on without its "
        "session (fail open, counted) and the store is skipped for a second.",
    )
    session_max_bytes: int = _setting(
        1024 * 1024,
        "Largest session record kept in a shared store; a larger one drops its oldest "
        "restored messages until it fits.",
    )
    volatile_patterns: tuple[str, ...] = _setting(
        (),
        "Extra regular expressions for volatile values in system prompts, moved to the "
        "tail of the prompt (comma-separated in env and CLI; YAML list).",
    )
    model_label_limit: int = _setting(
        32, "Distinct model names used as metric labels; later ones count as 'other'."
    )
    # Compaction (proxy.compaction): a running summary behind a window of recent turns.
    compaction: bool = _setting(
        True,
        "Compact long sessions near the context limit: old turns become a running summary "
        "behind a verbatim window of recent ones.",
    )
    context_limit: int = _setting(
        0,
        "Context length in tokens that the watermarks are fractions of; 0: the upstream's "
        "max_model_len from /v1/models.",
    )
    compaction_high: float = _setting(
        0.75, "Compact when a prompt would cross this fraction of the context limit."
    )
    compaction_soft: float = _setting(
        0.60, "Start the next summary in the background past this fraction of the limit."
    )
    compaction_window: float = _setting(
        0.25, "Newest turns kept verbatim after a compaction, as a fraction of the limit."
    )
    elide_after_steps: int = _setting(
        4, "At a compaction, tool results older than this many assistant steps may be elided."
    )
    elide_min_tokens: int = _setting(
        256, "Only tool results at least this long (tokens) are elided; 0: no elision."
    )
    summary_max_tokens: int = _setting(512, "Length cap of a summary, in tokens.")
    summary_wait: float = _setting(
        2.0,
        "Seconds a request past the high watermark waits for a summary still being written "
        "before it falls back to dropping the oldest turns.",
    )
    summary_timeout: float = _setting(120.0, "Seconds a summary request may take in all.")
    summarizer_url: str = _setting(
        "", "Base URL of the engine that writes summaries; empty: the upstream."
    )
    summarizer_model: str = _setting(
        "", "Model that writes summaries; empty: the model of the request being compacted."
    )
    # Speculative prefill (proxy.warmup) and round-trip savings.
    warmup: bool = _setting(
        True,
        "After a reply that ends in tool calls, prefill the next step's known prefix while "
        "the client runs its tools.",
    )
    warmup_max_inflight: int = _setting(4, "Warm-ups in flight at once, all sessions together.")
    warmup_max_waiting: int = _setting(
        0, "Skip warm-ups while the engine reports more than this many waiting requests."
    )
    warmup_max_proxy_inflight: int = _setting(
        64, "Skip warm-ups while the proxy has more than this many client requests in flight."
    )
    warmup_priority: int = _setting(
        0,
        "vLLM priority of warm-ups (higher runs later); 0: none sent (vLLM rejects a "
        "priority unless it runs --scheduling-policy priority).",
    )
    engine_block_size: int = _setting(
        0,
        "The engine's KV block size in tokens; 0: read it from vLLM's /metrics "
        "(cache_config_info), else 16.",
    )
    parallel_tool_calls: bool = _setting(
        True, "Ask for parallel_tool_calls where tools are offered and the client left it unset."
    )
    batching_instruction: bool = _setting(
        False,
        "Append a constant instruction to the system prompt: emit all independent tool "
        "calls of a step at once.",
    )
    fanout_hold: float = _setting(
        0.0,
        "Seconds a request may wait for a concurrent one with the same long, uncached prefix "
        "to reach its first token; 0: never hold. Only for engines that share a prefix once "
        "computed: vLLM V1 already shares one being computed, so holds there only add delay.",
    )
    fanout_min_tokens: int = _setting(
        1024, "Shortest shared prefix (estimated tokens) worth holding requests for."
    )
    tiktoken_cache_dir: str = _setting(
        "",
        "Where tiktoken's encoding files live; empty: tiktoken's own `TIKTOKEN_CACHE_DIR` "
        "(the image sets it) or a folder under the user cache, provisioned from the "
        "bpe-openai package.",
    )

    def __post_init__(self) -> None:
        for url in self.upstreams:
            if not url.startswith(("http://", "https://")):
                raise SettingsError(f"upstream must be http(s) URLs, got {url!r}")
        if self.upstream_dns_refresh < 0 or self.engine_max_waiting < 0:
            raise SettingsError("upstream_dns_refresh and engine_max_waiting must be >= 0")
        if self.upstream_dns_refresh and len(self.upstreams) > 1:
            raise SettingsError("upstream_dns_refresh takes one upstream URL (its host name)")
        if self.engine_placement not in ("prefix", "session"):
            raise SettingsError(
                f"engine_placement must be prefix or session, got {self.engine_placement!r}"
            )
        if self.engine_spread_load < 0:
            raise SettingsError("engine_spread_load must be >= 0")
        if self.engine_probe_interval <= 0:
            raise SettingsError("engine_probe_interval must be positive")
        for name in (
            "max_body_bytes",
            "max_sse_event_bytes",
            "max_reply_chars",
            "max_header_bytes",
            "max_header_count",
            "head_timeout",
            "body_timeout",
            "max_client_connections",
        ):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be positive")
        for name in ("connect_timeout", "read_timeout", "keepalive_expiry", "shutdown_grace"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name} must be positive")
        if self.total_timeout < 0:
            raise SettingsError("total_timeout must be >= 0 (0 = no limit)")
        if self.body_cache_bytes < 0 or self.early_upload_bytes < 0:
            raise SettingsError("body_cache_bytes and early_upload_bytes must be >= 0 (0 = off)")
        if self.max_connections < 1:
            raise SettingsError("max_connections must be at least 1")
        if self.session_max < 1 or self.session_ttl <= 0:
            raise SettingsError("session_max must be at least 1 and session_ttl positive")
        if self.session_store not in ("memory", "redis"):
            raise SettingsError(
                f"session_store must be memory or redis, got {self.session_store!r}"
            )
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise SettingsError("redis_url must start with redis://, rediss:// or unix://")
        if self.session_store_timeout <= 0 or self.session_max_bytes < 1024:
            raise SettingsError("session_store_timeout must be positive, session_max_bytes >= 1024")
        for name in ("compaction_high", "compaction_soft", "compaction_window"):
            if not 0 < getattr(self, name) < 1:
                raise SettingsError(f"{name} must be a fraction between 0 and 1")
        if not self.compaction_window < self.compaction_soft <= self.compaction_high:
            raise SettingsError(
                "compaction watermarks must satisfy window < soft <= high "
                f"(got {self.compaction_window} < {self.compaction_soft} <= "
                f"{self.compaction_high})"
            )
        if self.context_limit < 0 or self.summary_max_tokens < 1:
            raise SettingsError("context_limit must be >= 0 and summary_max_tokens >= 1")
        if self.summary_wait < 0 or self.summary_timeout <= 0 or self.fanout_hold < 0:
            raise SettingsError("summary_wait and fanout_hold must be >= 0, summary_timeout > 0")
        if self.summarizer_url and not self.summarizer_url.startswith(("http://", "https://")):
            raise SettingsError(
                f"summarizer_url must be an http(s) URL, got {self.summarizer_url!r}"
            )
        if self.warmup_max_inflight < 0 or self.engine_block_size < 0:
            raise SettingsError("warmup_max_inflight and engine_block_size must be >= 0")

    @property
    def upstreams(self) -> tuple[str, ...]:
        """The engines' base URLs, as configured."""
        return tuple(url.strip().rstrip("/") for url in self.upstream.split(",") if url.strip())

    @property
    def upstream_base(self) -> str:
        """The first engine's base URL (the only one, usually)."""
        return self.upstreams[0] if self.upstreams else self.upstream


def fields() -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(Settings)


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def _convert(field: dataclasses.Field[Any], raw: Any) -> Any:
    """Turn a YAML, environment or command-line value into the field's type."""
    kind = field.type
    try:
        if kind == "bool":
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"not a boolean: {raw!r}")
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind.startswith("tuple"):
            items = raw.split(",") if isinstance(raw, str) else list(raw)
            return tuple(str(item).strip() for item in items if str(item).strip())
        return str(raw)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{field.name}: {exc}") from exc


def _from_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SettingsError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must hold a mapping")
    known = {f.name for f in fields()}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SettingsError(f"unknown settings in {path}: {', '.join(unknown)}")
    return data


def load(
    overrides: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_file: str | None = None,
) -> Settings:
    """Build Settings from defaults, then a YAML file, then the environment, then overrides."""
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    config_file = config_file or environ.get(CONFIG_ENV)
    if config_file:
        raw.update(_from_yaml(Path(config_file)))
    for field in fields():
        if env_name(field.name) in environ:
            raw[field.name] = environ[env_name(field.name)]
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    by_name = {f.name: f for f in fields()}
    return Settings(**{name: _convert(by_name[name], value) for name, value in raw.items()})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One option per setting; unset options fall back to env, file and default."""
    parser.add_argument(
        "--config", metavar="FILE", help=f"YAML file with settings (env {CONFIG_ENV})."
    )
    for field in fields():
        flag = "--" + field.name.replace("_", "-")
        help_text = (
            f"{field.metadata['help']} [env {env_name(field.name)}; default {_default_text(field)}]"
        )
        parser.add_argument(flag, dest=field.name, default=None, metavar="VALUE", help=help_text)


def from_arguments(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    overrides = {f.name: getattr(args, f.name, None) for f in fields()}
    return load(overrides, environ=environ, config_file=getattr(args, "config", None))


def _default_text(field: dataclasses.Field[Any]) -> str:
    value = field.default
    if isinstance(value, tuple):
        return ",".join(value) or "(none)"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if value != "" else "(empty)"


def reference_rows() -> Sequence[tuple[str, str, str, str]]:
    """(setting, environment variable, default, meaning) for the README's table."""
    return [(f.name, env_name(f.name), _default_text(f), f.metadata["help"]) for f in fields()]
