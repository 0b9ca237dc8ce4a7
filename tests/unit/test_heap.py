"""proxy.heap: the trim gives freed heap pages back (on glibc, which this suite runs on);
the collector is set for serving and its pauses observed."""

from __future__ import annotations

import gc
import subprocess
import sys

from proxy import heap

# In a fresh interpreter: megabyte buffers freed after glibc raised its mmap threshold
# stay in the heap, between small buffers still in use, until the trim.
SCRIPT = """
from pathlib import Path
from proxy import heap

def resident():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024

bytearray(2 << 20)  # freed from its own mapping: glibc raises its threshold to 2 MB
pairs = [(bytearray(1 << 20), bytearray(1 << 10)) for _ in range(200)]
pins = [small for _, small in pairs]  # kept: they hold the heap around the holes
del pairs
before = resident()
assert heap.trim()
print(before, resident())
"""


def test_the_trim_gives_freed_buffers_back_to_the_system() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True
    ).stdout
    before, after = map(int, out.split())
    assert before - after >= 150, (before, after)  # MB: most of the 200 freed


# In a fresh interpreter, the collector off: a garbage cycle made before ``settle`` is
# freed by it, not frozen for good; what is alive is frozen; the young threshold goes up.
SETTLE = """
import gc, weakref
from proxy import heap

class Node:
    pass

gc.disable()
cycle = Node()
cycle.self = cycle
dead = weakref.ref(cycle)
del cycle
gc.enable()
heap.settle(young=5000)
print(dead() is None, gc.get_freeze_count() > 0, gc.get_threshold()[0])
"""


def test_settle_frees_start_up_garbage_before_freezing_the_rest() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SETTLE], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["True", "True", "5000"]


# In a fresh interpreter: a request's megabyte buffers, freed together, leave more than
# twice glibc's raised mmap threshold free at the heap's top, which glibc gives back at
# once, so the next request faults every page in again, unless the proxy's thresholds
# are set.
REUSE = """
import resource, sys
from proxy import heap

if sys.argv[1] == "set":
    assert heap.reuse_freed_pages()
first = b"x" * (1 << 20)
del first  # freed from its own mapping: glibc raises its threshold to 1 MB

def request():
    body = b"y" * (1 << 20)
    joined = body + b"z"
    return len(joined.replace(b"y", b"w"))

request()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    request()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _faults_per_request(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", REUSE, mode], capture_output=True, text=True, check=True
    ).stdout
    return float(out)


def test_freed_buffers_are_reused_without_faulting_their_pages_in_again() -> None:
    default, reused = _faults_per_request("default"), _faults_per_request("set")
    assert default > 500, default  # 3 MB a request given back and faulted in (768 pages)
    assert reused < 20, reused


def test_each_collection_in_the_block_is_observed_by_generation() -> None:
    seen: list[tuple[int, float]] = []
    enabled = gc.isenabled()
    gc.disable()  # only the collections asked for below
    try:
        with heap.pauses_observed(lambda generation, seconds: seen.append((generation, seconds))):
            gc.collect(0)
            gc.collect(2)
        gc.collect(1)  # after the block: not observed
    finally:
        if enabled:
            gc.enable()
    assert [generation for generation, _ in seen] == [0, 2]
    assert all(0 <= seconds < 60 for _, seconds in seen)
