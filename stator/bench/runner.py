"""Drives the load: warm-up, then one or more load points (closed loop, open loop, trace
replay, multi-turn sessions), collecting a `RequestRecord` per request."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import resource
import time
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec

from stator.bench.client import RequestRecord, build_body, send
from stator.bench.config import BenchConfig
from stator.bench.http import HttpClient, HttpError
from stator.bench.metrics import client_cpu, parse_slos, summarize
from stator.bench.prompts import PromptSource
from stator.bench.ready import wait_until_ready
from stator.bench.schedule import arrival_times
from stator.bench.workload import RequestSpec, from_trace, load_trace, synthetic

Progress = Callable[[int], None]


class PointResult(msgspec.Struct, kw_only=True):
    label: str
    mode: str  # concurrency | rate | trace | sessions
    value: float
    duration: float
    records: list[RequestRecord]
    summary: dict[str, Any]


class BenchResult(msgspec.Struct, kw_only=True):
    tag: str
    url: str
    model: str
    endpoint: str
    config: dict[str, Any]
    points: list[PointResult]


def _base(cfg: BenchConfig) -> str:
    """The server's root URL (a trailing /v1 is accepted and dropped)."""
    return cfg.url.rstrip("/").removesuffix("/v1")


def _path(cfg: BenchConfig) -> str:
    return "/v1/chat/completions" if cfg.endpoint == "chat" else "/v1/completions"


async def resolve_model(http: HttpClient, cfg: BenchConfig) -> str:
    if cfg.model:
        return cfg.model
    base = _base(cfg)
    try:
        resp = await http.request("GET", "/v1/models")
        raw = await resp.read()
    except HttpError as exc:
        raise RuntimeError(f"GET {base}/v1/models failed: {exc}") from exc
    http.release(resp)
    if resp.status != 200:
        raise RuntimeError(f"GET {base}/v1/models answered {resp.status}; pass --model")
    data = json.loads(raw)
    models = [m["id"] for m in data.get("data", [])]
    if not models:
        raise RuntimeError(f"{base} serves no model yet; pass --model or wait for a worker")
    return models[0]


class _Sender:
    def __init__(self, http: HttpClient, cfg: BenchConfig, model: str) -> None:
        self.http, self.cfg, self.model = http, cfg, model
        self.path = _path(cfg)
        self.t0 = time.perf_counter()

    async def one(
        self,
        spec: RequestSpec,
        prompt: Any = None,
        keep_text: bool = False,
        session_id: int | None = None,
        turn: int | None = None,
    ) -> RequestRecord:
        body = build_body(
            self.cfg.endpoint,
            self.model,
            prompt if prompt is not None else spec.prompt,
            spec.max_tokens,
            self.cfg.stream,
            self.cfg.ignore_eos,
        )
        record = RequestRecord(
            index=spec.index, start=time.perf_counter() - self.t0, session=session_id, turn=turn
        )
        return await send(self.http, self.path, body, record, keep_text, self.cfg.timeout)


async def closed_loop(
    sender: _Sender, specs: list[RequestSpec], concurrency: int, progress: Progress
) -> list[RequestRecord]:
    queue = list(reversed(specs))
    records: list[RequestRecord] = []

    async def worker() -> None:
        while queue:
            records.append(await sender.one(queue.pop()))
            progress(1)

    await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(specs))))))
    return records


async def open_loop(
    sender: _Sender,
    specs: list[RequestSpec],
    times: list[float],
    max_concurrency: int | None,
    progress: Progress,
) -> list[RequestRecord]:
    """Send spec i at times[i] seconds after the start, whatever is still running."""
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    start = time.perf_counter()

    async def fire(spec: RequestSpec, at: float) -> RequestRecord:
        delay = at - (time.perf_counter() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        if limit is None:
            record = await sender.one(spec)
        else:
            async with limit:
                record = await sender.one(spec)
        progress(1)
        return record

    return list(await asyncio.gather(*(fire(s, t) for s, t in zip(specs, times, strict=True))))


async def sessions_loop(
    sender: _Sender, cfg: BenchConfig, progress: Progress, salt: str
) -> list[RequestRecord]:
    """Multi-turn: each conversation sends its turns one after another, each turn carrying
    the whole history (the assistant's real answers included), so prefixes grow."""
    source = PromptSource(cfg.seed, cfg.tokenizer)
    records: list[RequestRecord] = []

    async def conversation(sid: int) -> None:
        history: list[dict[str, str]] = []
        for turn in range(cfg.turns):
            question = source.text(cfg.isl, f"session:{salt}:{sid}:{turn}")
            history.append({"role": "user", "content": question})
            spec = RequestSpec(
                index=sid * cfg.turns + turn,
                prompt=question,
                max_tokens=cfg.osl,
                input_tokens=cfg.isl,
            )
            prompt: Any = (
                list(history) if cfg.endpoint == "chat" else "".join(m["content"] for m in history)
            )
            record = await sender.one(spec, prompt, keep_text=True, session_id=sid, turn=turn)
            records.append(record)
            progress(1)
            if not record.ok:
                return
            history.append({"role": "assistant", "content": record.text})

    await asyncio.gather(*(conversation(s) for s in range(cfg.sessions)))
    return records


def _points(cfg: BenchConfig) -> list[tuple[str, float]]:
    if cfg.trace:
        return [("trace", cfg.time_scale)]
    if cfg.sessions:
        return [("sessions", float(cfg.sessions))]
    mode = "rate" if cfg.request_rate is not None else "concurrency"
    values = cfg.sweep or [cfg.request_rate if mode == "rate" else cfg.concurrency]
    return [(mode, float(v)) for v in values]


def _load(
    sender: _Sender, cfg: BenchConfig, mode: str, value: float, salt: str, progress: Progress
) -> Coroutine[Any, Any, list[RequestRecord]]:
    """The load of one point, its prompts already built (so that neither the clock nor the
    client's CPU meter counts building them; multi-turn prompts are built as it goes)."""
    if mode == "trace":
        assert cfg.trace is not None
        specs = from_trace(cfg, load_trace(cfg.trace), limit=cfg.num_requests or None)
        times = [s.arrival or 0.0 for s in specs]
        return open_loop(sender, specs, times, cfg.max_concurrency, progress)
    if mode == "sessions":
        return sessions_loop(sender, cfg, progress, salt)
    specs = synthetic(cfg, cfg.num_requests, salt=salt)
    if mode == "rate":
        times = arrival_times(value, len(specs), cfg.arrival, cfg.burstiness, cfg.seed)
        return open_loop(sender, specs, times, cfg.max_concurrency, progress)
    return closed_loop(sender, specs, int(value), progress)


async def run_point(
    sender: _Sender, cfg: BenchConfig, mode: str, value: float, salt: str, progress: Progress
) -> PointResult:
    slos = parse_slos(cfg.slo)
    load = _load(sender, cfg, mode, value, salt, progress)
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)  # (µs resolution; os.times: 10 ms)
    start = time.perf_counter()
    records = await load
    duration = time.perf_counter() - start
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    label = f"{mode}={value:g}"
    records.sort(key=lambda r: (r.start, r.index))
    summary = summarize(records, duration, slos)
    summary["client_cpu_per_request"] = client_cpu(
        cpu_after.ru_utime - cpu_before.ru_utime,
        cpu_after.ru_stime - cpu_before.ru_stime,
        len(records),
    )
    return PointResult(
        label=label, mode=mode, value=value, duration=duration, records=records, summary=summary
    )


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (the client spent about 15% less CPU per
    request on it than on asyncio's, benchmarks/README.md), else None: asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def requests_per_point(cfg: BenchConfig) -> int:
    if cfg.sessions:
        return cfg.sessions * cfg.turns
    return cfg.num_requests


async def run_benchmark(
    cfg: BenchConfig,
    progress: Progress | None = None,
    on_point: Callable[[PointResult], None] | None = None,
) -> BenchResult:
    """Run the whole benchmark described by `cfg` and return every record and summary."""
    parse_slos(cfg.slo)  # fail before sending anything
    progress = progress or (lambda n: None)
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else None
    http = HttpClient(_base(cfg), timeout=cfg.timeout, headers=headers)
    try:
        if cfg.ready_check_timeout_sec > 0:
            await wait_until_ready(http, _base(cfg), cfg.model, cfg.ready_check_timeout_sec)
        model = await resolve_model(http, cfg)
        sender = _Sender(http, cfg, model)
        if cfg.warmup:
            warm = synthetic(cfg, cfg.warmup, salt="warmup")
            await closed_loop(sender, warm, cfg.concurrency, lambda n: None)
        points = []
        for i, (mode, value) in enumerate(_points(cfg)):
            point = await run_point(sender, cfg, mode, value, f"point{i}", progress)
            points.append(point)
            if on_point is not None:
                on_point(point)
    finally:
        http.close()
    return BenchResult(
        tag=cfg.tag or cfg.url,
        url=cfg.url,
        model=model,
        endpoint=cfg.endpoint,
        # The key stays out of summary.json.
        config={**dataclasses.asdict(cfg), "api_key": "<set>" if cfg.api_key else None},
        points=points,
    )
