"""Memory a burst of big requests freed, handed back to the system every few seconds.

A proxy of agent requests allocates and frees megabyte buffers all the time (a 1 MB body
read, parsed, encoded again). glibc serves the first few from their own mappings, but it
raises its mmap threshold to the size of each one freed, so later ones come from the heap,
which keeps a burst's high-water mark resident after the burst. ``malloc_trim`` gives
the free pages back: after the overhead benchmark's run (all sizes, c=64 included),
450 -> 366 MB resident in 6 ms. Fixing the threshold instead cost 2.6x the CPU per 1 MB
request (a fresh mapping, zeroed, for every buffer). A C library other than glibc is left
as it is.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Callable

TRIM_INTERVAL_S = 10.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's, in the interpreter's C library
    except (OSError, AttributeError):  # musl and others have none
        return None


_TRIM = _malloc_trim()


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
