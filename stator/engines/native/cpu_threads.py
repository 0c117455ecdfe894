"""How many intra-op threads the engine's steps use on the CPU.

On a CPU every op of a step is an OpenMP parallel region: the step thread waits at each
op for all workers, so one worker that loses its core to another process stalls the whole
op. On a machine with idle cores the widest pool is fastest; on a busy one (a shared box,
or the event loop and tokenizer of this very process) a narrower pool is several times
faster. Neither is known in advance and load changes, so by default the engine measures:
it runs steps on the better of two thread counts and now and then probes the other one.
Switching counts did not change a single logit bit in the measured cases (matmuls, SDPA,
norms on this box's MKL build; see tests/engines/native/test_threads.py), so the tokens do
not depend on load.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import torch

_EWMA = 0.2  # weight of the newest sample in a running step-time estimate
# A freshly measured count takes over when it is this much cheaper than the current one.
_MARGIN = 1.1
# Without a fresh measurement (the other count's estimate may be old: contexts have grown
# since), the current count is left only when it got this much dearer than the other: a
# core lost to another process slows a step 5-20x, a hiccup of one step does not do it.
_SLOWDOWN = 2.0
_FIRST_PROBE_AFTER = 8  # steps on the chosen count before the other one is tried again
_SETTLED = 3  # samples before a losing probe backs probing off (first steps are noisy)
_MAX_PROBE_AFTER = 512  # probing backs off to at most one step in this many


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


@contextlib.contextmanager
def intra_op_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to `n` for the calling thread while inside (OpenMP keeps
    the count per thread; restored on exit so the caller's own torch work is unaffected)."""
    previous = torch.get_num_threads()
    if previous == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class _Arm:
    """Running estimate of one thread count's seconds per token, for one kind of step."""

    def __init__(self) -> None:
        self.cost: float | None = None
        self.samples = 0

    def record(self, seconds_per_token: float) -> None:
        self.samples += 1
        if self.cost is None:
            self.cost = seconds_per_token
        else:
            self.cost += _EWMA * (seconds_per_token - self.cost)


def _cost(arm: _Arm) -> float:
    return float("inf") if arm.cost is None else arm.cost


class _Kind:
    """The choice between the candidate counts for one kind of step (decode or prefill)."""

    def __init__(self, candidates: list[int]) -> None:
        self.arms = {n: _Arm() for n in candidates}
        self.current = candidates[0]
        self.probe_after = _FIRST_PROBE_AFTER
        self.since_probe = 0

    def pick(self) -> int:
        untried = [n for n, arm in self.arms.items() if arm.cost is None]
        if untried:
            return untried[0]
        if self.since_probe >= self.probe_after:
            return next(n for n in self.arms if n != self.current)
        return self.current

    def record(self, threads: int, seconds_per_token: float) -> None:
        """Switch when a probe of another count wins, or at once when load slows the
        current count far past the other's last estimate."""
        self.arms[threads].record(seconds_per_token)
        best = min(self.arms, key=lambda n: _cost(self.arms[n]))
        factor = _MARGIN if threads != self.current else _SLOWDOWN
        if best != self.current and _cost(self.arms[best]) * factor < _cost(
            self.arms[self.current]
        ):
            self.current = best
            self.probe_after = _FIRST_PROBE_AFTER
            self.since_probe = 0
        elif threads != self.current:  # a probe of another count lost: ask less often
            if self.arms[threads].samples >= _SETTLED:
                self.probe_after = min(2 * self.probe_after, _MAX_PROBE_AFTER)
            self.since_probe = 0
        else:
            self.since_probe += 1


class StepThreads:
    """Chooses each step's thread count: fixed when configured, else measured between all
    available cores and half of them (see the module docstring)."""

    def __init__(self, configured: int, widest: int | None = None) -> None:
        """`widest`: the most threads to try (default: the cores this process may use,
        at most torch's own default)."""
        if configured > 0:
            candidates = [configured]
        else:
            if widest is None:
                widest = min(available_cores(), torch.get_num_threads())
            widest = max(1, widest)
            candidates = sorted({widest, max(1, widest // 2)}, reverse=True)
        self.candidates = candidates
        self._kinds = {kind: _Kind(candidates) for kind in ("decode", "prefill")}

    def pick(self, decode: bool) -> int:
        return self._kinds["decode" if decode else "prefill"].pick()

    def record(self, decode: bool, threads: int, seconds: float, tokens: int) -> None:
        if len(self.candidates) > 1:
            kind = self._kinds["decode" if decode else "prefill"]
            kind.record(threads, seconds / max(1, tokens))

    @contextlib.contextmanager
    def scope(self, decode: bool, tokens: int) -> Iterator[int]:
        """Run the enclosed step on the chosen count and time it."""
        threads = self.pick(decode)
        with intra_op_threads(threads):
            start = time.perf_counter()
            yield threads
            self.record(decode, threads, time.perf_counter() - start, tokens)
