"""`benchmarks/planner.py`'s experiment in simulated time: the planner's pure core (the
same `Planner`, configs and profile) scaling a simulated fleet, against static fleets.

    PYTHONPATH=. python benchmarks/planner_sim.py --runs "planner:C,D static:3,4,5,6"

What is simulated: each worker as `benchmarks/planner_model.py` does (a vLLM-style
scheduler with the mocker's timing, × `--slowdown`, ÷ `--time-scale`), round-robin routing
over ready workers as the bench's frontend does, a worker ready `--start-delay` wall
seconds after it is started, a drained worker finishing its requests before it stops, and
the frontend metrics the planner reads (the frontend's own histograms, read by the
planner's own `observe.traffic`: requests by first token, ISL/OSL of the finished
requests, p90 TTFT and ITL interpolated within buckets as Prometheus does). What is not: the CPU the real processes share
(on the 2-core dev box, with other work running, that is most of the difference), HTTP,
and prefix caching (12% of the sampled trace's prompt tokens). It needs no CPU time to
speak of, so the planner's settings can be compared where real runs are too noisy; the
real runs remain the measurement of record.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.planner_experiment import (  # noqa: E402
    Record,
    add_arguments,
    intervals,
    profile_path,
    runs,
    share_met,
    trace_requests,
    variant_config,
)
from stator.engines.mocker.timing import PolynomialTiming, StepShape  # noqa: E402
from stator.frontend.metrics import FrontendMetrics  # noqa: E402
from stator.planner.core import Observation, Planner, RoleObservation  # noqa: E402
from stator.planner.observe import parse_metrics, traffic  # noqa: E402
from stator.planner.profile import PerfProfile  # noqa: E402

KV_TOKENS = 16384 * 64
BUDGET = 8192  # max_num_batched_tokens


@dataclass
class Request:
    at: float
    isl: float
    osl: int
    left_prompt: float = 0.0
    context: float = 0.0
    left_out: int = 0
    record: Record = None  # type: ignore[assignment]
    last: float = 0.0  # when its latest token came


@dataclass
class Worker:
    started: float
    ready_at: float
    stopped: float | None = None
    draining: bool = False
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    step_end: float | None = None
    step: tuple | None = None  # (prefill done, decoding) of the step in flight

    def idle(self) -> bool:
        return not self.waiting and not self.running


class Fleet:
    def __init__(self, args) -> None:
        self.args = args
        self.poly = PolynomialTiming()
        self.scale = args.slowdown / args.time_scale / 1000  # poly ms -> wall s
        self.workers: list[Worker] = []
        self.rr = 0
        # What the frontend would export, observed as its GenerationTracker does.
        self.metrics = FrontendMetrics()
        self.model = self.metrics.for_model("sim")
        self.last_event = 0.0

    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.stopped is None and not w.draining]

    def scale_to(self, now: float, desired: int) -> None:
        live = self.live()
        for _ in range(desired - len(live)):
            self.workers.append(Worker(now, now + self.args.start_delay))
        for w in sorted(live, key=lambda w: w.started)[desired:] if desired < len(live) else []:
            w.draining = True
            if w.idle() and w.step_end is None:
                w.stopped = now

    def route(self, now: float, req: Request) -> None:
        ready = [w for w in self.live() if w.ready_at <= now]
        if not ready:  # the frontend waits for a worker; the first to be ready takes it
            ready = [min(self.live(), key=lambda w: w.ready_at)]
        worker = ready[self.rr % len(ready)]
        self.rr += 1
        worker.waiting.append(req)
        self.kick(max(now, worker.ready_at), worker)

    def kick(self, now: float, w: Worker) -> None:
        """Start `w`'s next step if it is free and has work."""
        if w.step_end is not None or w.idle() or now < w.ready_at:
            return
        decoding = list(w.running)
        context = sum(r.context for r in decoding)
        budget, prefill, done = BUDGET - len(decoding), 0.0, []
        for req in w.waiting:
            if budget <= 0:
                break
            take = min(budget, req.left_prompt)
            req.left_prompt -= take
            budget -= take
            prefill += take
            if req.left_prompt > 0:
                break
            done.append(req)
        for _ in done:
            w.waiting.popleft()
        ms = self.poly.prefill_ms(StepShape(int(prefill), 0, 0, KV_TOKENS)) if prefill else 0.0
        if decoding:
            ms += self.poly.decode_ms(StepShape(0, len(decoding), int(context), KV_TOKENS))
        w.step_end = now + ms * self.scale
        w.step = (done, decoding)

    def finish(self, req: Request) -> None:
        self.model.input_tokens.observe(req.isl)
        self.model.output_tokens.observe(req.osl)

    def finish_step(self, w: Worker) -> None:
        now, (done, decoding) = w.step_end, w.step
        w.step_end = w.step = None
        for req in decoding:
            gap = now - req.last
            req.last = now
            req.record.gaps.append((now, gap))
            self.model.itl.observe(gap)
            req.context += 1
            req.left_out -= 1
        still = [r for r in w.running if r.left_out > 0]
        for req in w.running:
            if req.left_out <= 0:
                self.finish(req)
        for req in done:
            req.record.ttft = now - req.at
            self.model.ttft.observe(req.record.ttft)
            req.last = now
            if req.left_out > 0:
                still.append(req)
            else:
                self.finish(req)
        w.running = still
        self.last_event = now
        if w.draining and w.idle():
            w.stopped = now
        else:
            self.kick(now, w)


def run(kind: str, arg: str, plan, args, profile: PerfProfile) -> dict:
    fleet = Fleet(args)
    planner = None
    if kind == "static":
        fleet.scale_to(-args.start_delay, int(arg))
    else:
        config = variant_config(arg, args)
        for key, value in json.loads(args.override).items():
            setattr(config, key, value)
        planner = Planner(config, profile)
        fleet.scale_to(-args.start_delay, max(1, config.min_workers))
        interval = config.adjustment_interval
    requests = []
    for a in plan:
        req = Request(a.at, a.isl, a.osl, a.isl, a.isl, a.osl - 1, Record(a.at))
        requests.append(req)
    next_tick = interval if planner else math.inf
    last_snapshot = None
    i, now, decisions = 0, 0.0, []
    while True:
        busy = [w for w in fleet.workers if w.step_end is not None]
        t_step = min((w.step_end for w in busy), default=math.inf)
        t_arrival = requests[i].at if i < len(requests) else math.inf
        t_ready = min(
            (w.ready_at for w in fleet.workers if w.stopped is None and w.ready_at > now),
            default=math.inf,
        )
        now = min(t_step, t_arrival, next_tick, t_ready)
        if now == math.inf or (i >= len(requests) and not busy and next_tick == math.inf):
            break
        if now == t_ready:
            for w in fleet.workers:
                if w.ready_at == now:
                    fleet.kick(now, w)
        elif now == t_step:
            for w in busy:
                if w.step_end == now:
                    fleet.finish_step(w)
        elif now == t_arrival:
            fleet.route(now, requests[i])
            i += 1
        else:
            snapshot = parse_metrics(fleet.metrics.render().decode())
            seen = traffic(snapshot, last_snapshot)
            last_snapshot = snapshot
            role = RoleObservation(
                pool="sim", workers=len(fleet.live()),
                ready=sum(1 for w in fleet.live() if w.ready_at <= now),
                requests=seen.requests, isl=seen.isl, osl=seen.osl, isl_p90=seen.isl_p90,
                ttft_p90_ms=seen.ttft_p90_ms, itl_p90_ms=seen.itl_p90_ms,
            )  # fmt: skip
            (d,) = planner.tick(Observation(time=now, interval=interval, roles=[role]))
            decisions.append((now, d.current, d.desired, d.reason, d.correction, d.itl_correction))
            if d.changed:
                fleet.scale_to(now, d.desired)
            done = i >= len(requests) and all(w.idle() for w in fleet.workers)
            next_tick = math.inf if done else now + interval
    t_end = fleet.last_event
    records = [r.record for r in requests]
    # Gap times are absolute; planner.py's records hold them relative to the replay start,
    # which is 0 here too.
    windows = intervals(records, args)
    met, scored = share_met(windows)
    ws = sum(
        max(0.0, min(w.stopped if w.stopped is not None else t_end, t_end) - max(w.started, 0.0))
        for w in fleet.workers
    ) * args.time_scale  # fmt: skip
    return {
        "run": f"{kind}:{arg}", "intervals_met": met, "intervals": scored,
        "worker_seconds": ws,
        "decisions": decisions, "windows": windows,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, runs="planner:E,F static:3,4,5,6")
    parser.add_argument(
        "--seeds", type=int, default=1, help="samples of the trace (seed 0 = bench's)"
    )
    parser.add_argument("--start-delay", type=float, default=3.0, help="wall s to ready")
    parser.add_argument("--out", default="/tmp/stator-planner-sim.json")
    parser.add_argument(
        "--override",
        default="{}",
        help='planner settings over the variants\', e.g. {"sla_headroom": 1}',
    )
    args = parser.parse_args()
    profile = PerfProfile.load(profile_path(args))
    results = []
    for seed in range(args.seeds):
        plan = list(trace_requests(args, seed))
        for kind, name in runs(args.runs):
            r = run(kind, name, plan, args, profile)
            r["seed"] = seed
            results.append(r)
            print(
                f"seed {seed} {r['run']:<11} met {r['intervals_met'] * 100:5.1f}% of "
                f"{r['intervals']}, {r['worker_seconds']:6.0f} worker-s",
                flush=True,
            )
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
