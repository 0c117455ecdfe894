"""Where an engine-alone run's time goes, step by step (`native_gpu_http_vs_engine.py`).

`StepProfile(core).step()` stands in for `core.step()` and records each step's shape (how
many sequences, tokens, prompt tokens), its wall time, the part of it the host spent
waiting for the device (the overlapped read-back of sampled tokens: a step that waits
little was bound by the host, not the GPU), the tokens it emitted and whether prompts
were still queued; for the per-step ledger (`step_ledger.py`): what it computes
(`step_work`: decodes and the KV context they read, prompt tokens and their attention
pairs), how it ran (a decode graph, piecewise graphs or eagerly), its device time and the
GPU's idle gap before it (CUDA events, `device_times()`), the host's time in the forward
pass's call and in Python's garbage collector, and after a slow step the CUDA caching
allocator's cudaMalloc / cudaFree calls and retries since the last read. It drains the core's KV events after each
step, as the engine core's process does. `summary()` groups the steps by kind (pure
decode or mixed), by batch size, and the tail after the queue emptied, where batches only
shrink. `thread_cpu()` reads each thread's CPU time from /proc (which thread takes a
process past 100%).
`gpu_busy(run)`: the GPU's busy fraction over `run` from torch.profiler (short runs only).
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

BATCH_BOUNDS = (8, 32, 64, 128, 192, 255, 256, 512, 1024)
SLOW_STEP_S = 0.05  # after a step this slow, the CUDA allocator's work since the last read


class StepProfile:
    def __init__(self, core) -> None:
        from stator.engines.native import overlap

        self.core = core
        self.records: list[dict] = []
        self._batch = None
        self._shape: tuple = ((), (), ())
        self._mode = "none"
        self._wait = 0.0
        self._cuda = core.runner.device.type == "cuda"
        self._events: list[tuple] = []  # (start, end) CUDA events of each record
        self._begin = None  # the CUDA event before this step's forward pass
        self._launch = 0.0
        self._gc = [0.0, 0, 0.0]  # seconds in collections, full ones, when one began
        self._alloc = self._allocator_counts()
        gc.callbacks.append(self._on_gc)
        schedule = core.scheduler.schedule

        def recording_schedule():
            batch = self._batch = schedule()
            # Before the step runs: what each sequence has computed and will compute.
            self._shape = (
                [s.num_computed_tokens for s in batch.seqs],
                [s.num_prompt_tokens for s in batch.seqs],
                list(batch.num_new_tokens),
            )
            return batch

        core.scheduler.schedule = recording_schedule
        tokens = overlap.PendingStep.tokens

        def timed_tokens(pending):
            start = time.perf_counter()
            try:
                return tokens(pending)
            finally:
                self._wait += time.perf_counter() - start

        overlap.PendingStep.tokens = timed_tokens
        runner = core.runner
        for attr, mode in (("graphs", "graph"), ("piecewise", "pieces")):
            graphs = getattr(runner, attr)
            if graphs is not None:
                graphs.run = self._noting(graphs.run, mode)
        execute = runner.execute

        def timed_execute(inputs):
            # The forward pass starts here: before it, the host scheduled and prepared.
            if self._cuda:
                import torch

                self._begin = torch.cuda.Event(enable_timing=True)
                self._begin.record()
            start = time.perf_counter()
            try:
                return execute(inputs)
            finally:
                self._launch += time.perf_counter() - start

        runner.execute = timed_execute

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc[2] = time.perf_counter()
            return
        self._gc[0] += time.perf_counter() - self._gc[2]
        self._gc[1] += info.get("generation") == 2

    def reset(self) -> None:
        """Forget the steps recorded so far (a new run begins)."""
        self.records = []
        self._events = []
        self._alloc = self._allocator_counts()

    def _allocator_counts(self) -> tuple[int, int, int]:
        """The CUDA caching allocator's cumulative cudaMalloc calls, cudaFree calls and
        retries (a cudaMalloc that failed, so every cached block was freed, the device
        synchronized, and it tried again); zeros without CUDA."""
        if not self._cuda:
            return (0, 0, 0)
        import torch

        stats = torch.cuda.memory_stats()
        return (
            stats.get("num_device_alloc", 0),
            stats.get("num_device_free", 0),
            stats.get("num_alloc_retries", 0),
        )

    def _noting(self, run, mode: str):
        def noted(*args, **kwargs):
            self._mode = mode
            return run(*args, **kwargs)

        return noted

    def step(self) -> list:
        queued = bool(self.core.scheduler.waiting)
        wait0, start = self._wait, time.perf_counter()
        gc0, full0 = self._gc[0], self._gc[1]
        self._batch = None
        self._shape = ((), (), ())
        self._mode = "eager"
        self._begin = None
        self._launch = 0.0
        outputs = self.core.step()
        # As the engine core's process does after each step: left undrained, a run's KV
        # events pile up (tens of thousands) and each full collection walks them all.
        self.core.drain_kv_events()
        wall = time.perf_counter() - start
        end = None
        if self._begin is not None:
            import torch

            end = torch.cuda.Event(enable_timing=True)
            end.record()
        self._events.append((self._begin, end))
        batch = self._batch
        news = batch.num_new_tokens if batch else []
        rec = {
            "seqs": len(news),
            "tokens": sum(news),
            "prompt_tokens": sum(n for n in news if n > 1),
            "wall": wall,
            "wait": self._wait - wait0,
            "emitted": sum(len(out.token_ids) for _, out in outputs),
            "queued": queued,
            "mode": self._mode if news else "none",
            "launch": self._launch,  # the host's time in the forward pass's call
            "gc": self._gc[0] - gc0,  # the host's time in Python's cyclic collector
            "gc_full": self._gc[1] - full0,  # full (generation 2) collections
            **step_work(*self._shape),
        }
        if wall > SLOW_STEP_S:
            # Read only after a slow step (the read costs the host): what the allocator did
            # since the last read, most likely in this step, a stall's suspect.
            now = self._allocator_counts()
            rec["cuda_mallocs"], rec["cuda_frees"], rec["alloc_retries"] = (
                a - b for a, b in zip(now, self._alloc, strict=True)
            )
            self._alloc = now
        self.records.append(rec)
        return outputs

    def device_times(self) -> None:
        """Fill each record's `device` (seconds from the GPU reaching the step's forward
        pass to finishing its sampling, idle stretches inside included: an eager step bound
        by its launches shows here) and `gap` (seconds the GPU sat idle between the last
        step's end and this forward pass: the host scheduled and prepared late). Without
        CUDA: the wall time, no gaps. Call after the run (it waits for the device)."""
        if not self._cuda:
            for r in self.records:
                r["device"], r["gap"] = r["wall"], 0.0
            return
        import torch

        torch.cuda.synchronize()
        prev = None
        for rec, (begin, end) in zip(self.records, self._events, strict=True):
            rec["device"] = rec["gap"] = 0.0
            if begin is None:
                continue
            rec["device"] = begin.elapsed_time(end) / 1e3
            # Negative when the forward pass queued behind the last step's work.
            rec["gap"] = max(0.0, prev.elapsed_time(begin) / 1e3) if prev is not None else 0.0
            prev = end
        self._events = []

    def summary(self) -> dict:
        recs = self.records
        out: dict = {"steps": len(recs), "seconds": sum(r["wall"] for r in recs)}
        out["device_wait_share"] = sum(r["wait"] for r in recs) / max(out["seconds"], 1e-9)
        kinds = {
            "decode": [r for r in recs if r["seqs"] and not r["prompt_tokens"]],
            "mixed": [r for r in recs if r["prompt_tokens"]],
        }
        out["by_kind"] = {k: _group(v) for k, v in kinds.items()}
        by_batch: dict[str, dict] = {}
        low = 1
        for high in BATCH_BOUNDS:
            group = [r for r in recs if low <= r["seqs"] <= high]
            if group:
                by_batch[f"{low}-{high}"] = _group(group)
            low = high + 1
        out["by_batch"] = by_batch
        last_queued = max((i for i, r in enumerate(recs) if r["queued"]), default=-1)
        out["tail_after_queue_empty"] = _group(recs[last_queued + 1 :])
        return out


def step_work(computed: list[int], prompt: list[int], news: list[int]) -> dict:
    """What a step computes, from each scheduled sequence's tokens computed before it, its
    prompt length and its new tokens (the fields `step_ledger` prices): a sequence past its
    prompt that computes one token decodes (it reads its `computed` earlier positions);
    any other computes prompt tokens (a chunk, or a preempted sequence's recompute)."""
    decodes = kv_context = prefill = ended = pairs = 0
    for c, p, n in zip(computed, prompt, news, strict=True):
        if n == 1 and c >= p:
            decodes += 1
            kv_context += c
            continue
        prefill += n
        ended += c + n >= p
        # Causal pairs of positions c .. c + n - 1, each attending to itself and before.
        pairs += n * c + n * (n + 1) // 2
    return {
        "decodes": decodes,
        "kv_context": kv_context,
        "prefill_tokens": prefill,
        "prompts_ended": ended,
        "attn_pairs": pairs,
    }


def _group(recs: list[dict]) -> dict:
    secs = sum(r["wall"] for r in recs)
    steps = len(recs)
    walls = sorted(r["wall"] for r in recs)
    return {
        "steps": steps,
        "seconds": round(secs, 3),
        "ms_per_step": round(1e3 * secs / steps, 3) if steps else 0.0,
        "ms_p50": round(1e3 * walls[len(walls) // 2], 3) if steps else 0.0,
        "ms_max": round(1e3 * walls[-1], 3) if steps else 0.0,
        "device_wait_ms": round(1e3 * sum(r["wait"] for r in recs) / steps, 3) if steps else 0.0,
        "mean_seqs": round(sum(r["seqs"] for r in recs) / steps, 1) if steps else 0.0,
        "mean_tokens": round(sum(r["tokens"] for r in recs) / steps, 1) if steps else 0.0,
        "emitted": sum(r["emitted"] for r in recs),
        "emitted_per_s": round(sum(r["emitted"] for r in recs) / secs) if secs else 0,
    }


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process, keyed 'name (tid)'."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path("/proc/self/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[f"{name} ({task.name})"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def busiest_threads(before: dict[str, float], after: dict[str, float], secs: float) -> dict:
    """The five threads with the most CPU between two `thread_cpu()` reads, in % of a core."""
    used = {k: v - before.get(k, 0.0) for k, v in after.items()}
    top = sorted(used.items(), key=lambda kv: -kv[1])[:5]
    return {k: round(100 * v / max(secs, 1e-9)) for k, v in top}


def _kernel_trace(run) -> tuple[list, float, float]:
    """The CUDA kernels torch.profiler saw over `run`, the span from the first kernel's start
    to the last one's end, and the time within it during which some kernel ran (µs)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    return kernels, spans[-1][1] - spans[0][0], busy


def _us_by_name(kernels: list, width: int) -> dict[str, list[float]]:
    per_name: dict[str, list[float]] = {}
    for e in kernels:
        per_name.setdefault(e.name[:width], []).append(e.time_range.elapsed_us())
    return dict(sorted(per_name.items(), key=lambda kv: -sum(kv[1])))


def gpu_busy(run) -> dict:
    """The fraction of `run`'s span during which some kernel ran (torch.profiler): below 1,
    the GPU waited for the host; and the kernels that took the most GPU time."""
    kernels, span, busy = _kernel_trace(run)
    top = list(_us_by_name(kernels, 60).items())[:8]
    return {
        "busy": busy / span,
        "kernels": len(kernels),
        "top_ms": {name: round(sum(us) / 1e3, 2) for name, us in top},
    }


def kernel_profile(run, steps: int) -> dict:
    """Kernels per step, GPU ms per step by kernel name and the busy fraction of `run`
    (`steps` steps)."""
    kernels, span, busy = _kernel_trace(run)
    per_name = _us_by_name(kernels, 70)
    return {
        "kernels_per_step": len(kernels) / steps,
        "gpu_ms_per_step": sum(sum(v) for v in per_name.values()) / steps / 1e3,
        "span_ms_per_step": span / steps / 1e3,
        "busy": busy / span,
        "by_kernel": {
            name: {"n": len(v) / steps, "ms": round(sum(v) / steps / 1e3, 4)}
            for name, v in per_name.items()
        },
    }


def host_profile(run) -> dict:
    """Where the host's time goes over `run` (a few steps): torch.profiler's CPU-side ops
    by self time (CUDA runtime calls included, so a synchronize or a pageable copy that
    waits for the device shows here), then, over a second `run`, cProfile's Python
    functions by own time."""
    import cProfile
    import pstats

    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]
    out: dict = {
        "torch_self_cpu_ms": {
            f"{e.key[:60]} x{e.count}": round(e.self_cpu_time_total / 1e3, 2) for e in ops
        }
    }
    python = cProfile.Profile()
    python.enable()
    run()
    if cuda:
        torch.cuda.synchronize()
    python.disable()
    rows = sorted(pstats.Stats(python).stats.items(), key=lambda kv: -kv[1][2])[:20]
    out["python_tottime_ms"] = {
        f"{name} ({Path(file).name}:{line}) x{calls[1]}": round(1e3 * calls[2], 2)
        for (file, line, name), calls in rows
    }
    return out
