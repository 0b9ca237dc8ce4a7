"""The process's memory: freed pages handed back to the system every few seconds, and
the cyclic garbage collector set for a long-running server.

A proxy of agent requests allocates and frees megabyte buffers all the time (a 1 MB body
read, parsed, encoded again). glibc serves the first few from their own mappings, but it
raises its mmap threshold to the size of each one freed, so later ones come from the heap,
which keeps a burst's high-water mark resident after the burst. ``malloc_trim`` gives
the free pages back: after the overhead benchmark's run (all sizes, c=64 included),
450 -> 366 MB resident in 6 ms. Fixing the threshold low instead cost 2.6x the CPU per
1 MB request (a fresh mapping, zeroed, for every buffer). A C library other than glibc is
left as it is.

The raised threshold is not enough on its own (``reuse_freed_pages``): glibc also gives
the heap's top back on every free that leaves more than twice the threshold free there,
which a request's few megabyte buffers, freed together, do. The next request then faults
every page in again. Whether that happens depends on what else sits at the heap's top, so
a process falls into it or not by chance: in the overhead benchmark at 1 MB the same
relay took 1.6 ms of CPU a request in one run and 4.6 ms in another, at about 750 page
faults a request. The proxy sets both thresholds, once, and leaves the giving back to the
trim.

The collector (``settle``): CPython runs its youngest collection every 700 container
objects allocated net of those freed, and each one walks the young objects alive. At c=64
that is every in-flight request's objects, and the collections find almost no garbage
(about one cycle per request): in the overhead benchmark at 64 KB c=64, 350 young and 31
middle collections took 190 ms over 1,456 requests, and two full ones (every object
start-up made walked again) 35 ms, one stall of about 17 ms each. ``settle`` moves what
start-up made out of the collector's way for good (``gc.freeze``: modules, classes, the
app) and collects the young generation every YOUNG_THRESHOLD allocations instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import time
from collections.abc import Callable, Iterator

TRIM_INTERVAL_S = 10.0
YOUNG_THRESHOLD = 10_000
# glibc's mallopt parameters (malloc.h) and the values the proxy serves with.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit: bigger buffers get their own mapping
TRIM_THRESHOLD = 128 << 20  # beyond a burst this large, free() gives the top back at once


def _glibc(name: str) -> Callable[..., int] | None:
    try:
        return getattr(ctypes.CDLL(None), name)  # in the interpreter's C library
    except (OSError, AttributeError):  # musl and others have none
        return None


_TRIM = _glibc("malloc_trim")
_MALLOPT = _glibc("mallopt") if _TRIM is not None else None  # musl's mallopt does nothing


def reuse_freed_pages() -> bool:
    """Keep freed buffers' pages in the heap for the next request's buffers, until the
    periodic ``trim``: both thresholds set (setting either one stops glibc's raising of
    the mmap threshold, so both are). Whether the C library took them."""
    if _MALLOPT is None:
        return False
    mmap = _MALLOPT(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    trim = _MALLOPT(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return bool(mmap and trim)


def trim() -> bool:
    """Give the heap's free pages back to the system; whether the C library could."""
    return _TRIM is not None and bool(_TRIM(0))


async def trim_every(interval: float = TRIM_INTERVAL_S) -> None:
    """``trim`` every ``interval`` seconds, in a thread (ctypes lets go of the GIL): the
    event loop goes on, and waits only if it allocates while glibc holds the arena's lock
    for the few milliseconds a trim takes."""
    if _TRIM is None:
        return
    while True:
        await asyncio.sleep(interval)
        await asyncio.to_thread(trim)


def settle(young: int = YOUNG_THRESHOLD) -> None:
    """Set the collector for serving, once start-up is done: its garbage collected, what
    is left of it frozen (never walked again), and the young generation collected every
    ``young`` net allocations (never more often than it was)."""
    gc.collect()  # garbage frozen would never be freed
    gc.freeze()
    current, middle, old = gc.get_threshold()
    if current:  # 0: the collector is off, and stays so
        gc.set_threshold(max(current, young), middle, old)


class _Pauses:
    """A gc.callbacks entry: each collection's wall time, to ``observe(generation, seconds)``.
    The collector runs on whichever thread allocated past its threshold (the event loop's,
    now and then the trim's) and holds the GIL throughout: nothing else runs meanwhile, and
    two collections never overlap."""

    __slots__ = ("_observe", "_started")

    def __init__(self, observe: Callable[[int, float], None]) -> None:
        self._observe = observe
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._observe(info["generation"], time.perf_counter() - self._started)


@contextlib.contextmanager
def pauses_observed(observe: Callable[[int, float], None]) -> Iterator[None]:
    """``observe(generation, seconds)`` after each collection of the cyclic collector, in
    this process, while in the block (2: a full collection, which walks every object the
    proxy holds: its sessions, its kept bodies)."""
    pauses = _Pauses(observe)
    gc.callbacks.append(pauses)
    try:
        yield
    finally:
        gc.callbacks.remove(pauses)
