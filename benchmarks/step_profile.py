"""Where an engine-alone run's time goes, step by step (`native_gpu_http_vs_engine.py`).

`StepProfile(core).step()` stands in for `core.step()` and records each step's shape (how
many sequences, tokens, prompt tokens), its wall time, the part of it the host spent
waiting for the device (the overlapped read-back of sampled tokens: a step that waits
little was bound by the host, not the GPU), the tokens it emitted and whether prompts
were still queued. `summary()` groups the steps by kind (pure decode or mixed), by batch
size, and the tail after the queue emptied, where batches only shrink. `thread_cpu()`
reads each thread's CPU time from /proc (which thread takes a process past 100%).
`gpu_busy(run)`: the GPU's busy fraction over `run` from torch.profiler (short runs only).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

BATCH_BOUNDS = (8, 32, 64, 128, 192, 255, 256, 512, 1024)


class StepProfile:
    def __init__(self, core) -> None:
        from stator.engines.native import overlap

        self.core = core
        self.records: list[dict] = []
        self._batch = None
        self._wait = 0.0
        schedule = core.scheduler.schedule

        def recording_schedule():
            self._batch = schedule()
            return self._batch

        core.scheduler.schedule = recording_schedule
        tokens = overlap.PendingStep.tokens

        def timed_tokens(pending):
            start = time.perf_counter()
            try:
                return tokens(pending)
            finally:
                self._wait += time.perf_counter() - start

        overlap.PendingStep.tokens = timed_tokens

    def step(self) -> list:
        queued = bool(self.core.scheduler.waiting)
        wait0, start = self._wait, time.perf_counter()
        self._batch = None
        outputs = self.core.step()
        wall = time.perf_counter() - start
        batch = self._batch
        news = batch.num_new_tokens if batch else []
        self.records.append(
            {
                "seqs": len(news),
                "tokens": sum(news),
                "prompt_tokens": sum(n for n in news if n > 1),
                "wall": wall,
                "wait": self._wait - wait0,
                "emitted": sum(len(out.token_ids) for _, out in outputs),
                "queued": queued,
            }
        )
        return outputs

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
