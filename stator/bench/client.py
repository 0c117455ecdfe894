"""One request over HTTP, timed: the client's hot path.

Each streamed chunk costs one `perf_counter()` and one typed msgspec decode that reads only
the fields we need, so the client stays far below a millisecond of CPU per request.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import msgspec


class RequestRecord(msgspec.Struct, kw_only=True):
    index: int
    start: float  # seconds since the benchmark started
    session: int | None = None
    turn: int | None = None
    ttft: float | None = None  # seconds from send to the first content chunk
    ttst: float | None = None  # ... to the second content chunk
    latency: float | None = None  # ... to the end of the response
    chunk_times: list[float] = msgspec.field(default_factory=list)  # since send
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    status: int = 0
    error: str | None = None
    text: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Any] | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    message: _Delta | None = None
    text: str | None = None


class _Details(msgspec.Struct):
    cached_tokens: int | None = 0


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: _Details | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: Any = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


def _choice_text(choice: _Choice) -> str:
    d = choice.delta or choice.message
    if d is not None:
        return (d.content or "") + (d.reasoning_content or d.reasoning or "")
    return choice.text or ""


def _has_output(choice: _Choice) -> bool:
    d = choice.delta or choice.message
    if d is not None:
        return bool(d.content or d.reasoning_content or d.reasoning or d.tool_calls)
    return bool(choice.text)


def build_body(
    endpoint: str,
    model: str,
    prompt: str | list[dict],
    max_tokens: int,
    stream: bool,
    ignore_eos: bool,
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": stream}
    if endpoint == "chat":
        body["messages"] = (
            prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        )
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    return body


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    record: RequestRecord,
    keep_text: bool = False,
) -> RequestRecord:
    """POST `body` to `url` and fill `record` with timings, usage and status."""
    clock = time.perf_counter
    t0 = clock()
    pieces: list[str] = []
    try:
        async with session.post(url, json=body) as resp:
            record.status = resp.status
            if resp.status != 200:
                record.error = (await resp.text())[:500]
                return record
            if body.get("stream"):
                await _read_stream(resp, record, t0, pieces if keep_text else None)
            else:
                chunk = _decode_chunk(await resp.read())
                now = clock() - t0
                record.ttft = record.latency = now
                _apply_usage(record, chunk.usage)
                if keep_text and chunk.choices:
                    pieces.append(_choice_text(chunk.choices[0]))
    except (aiohttp.ClientError, TimeoutError, msgspec.DecodeError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    if record.latency is None and record.error is None:
        record.latency = clock() - t0
    record.text = "".join(pieces)
    return record


async def _read_stream(
    resp: aiohttp.ClientResponse, record: RequestRecord, t0: float, pieces: list[str] | None
) -> None:
    clock = time.perf_counter
    times = record.chunk_times
    done = False
    async for line in resp.content:
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            record.latency = clock() - t0
            done = True
            break
        chunk = _decode_chunk(payload)
        if chunk.error is not None:
            record.error = str(chunk.error)[:500]
            break
        if chunk.choices and any(_has_output(c) for c in chunk.choices):
            now = clock() - t0
            times.append(now)
            if pieces is not None:
                pieces.append(_choice_text(chunk.choices[0]))
        if chunk.usage is not None:
            _apply_usage(record, chunk.usage)
    if times:
        record.ttft = times[0]
        record.ttst = times[1] if len(times) > 1 else None
    if not done and record.error is None:
        record.error = "stream ended before data: [DONE]"
    if record.latency is None:
        record.latency = clock() - t0


def _apply_usage(record: RequestRecord, usage: _Usage | None) -> None:
    if usage is None:
        return
    record.input_tokens = usage.prompt_tokens
    record.output_tokens = usage.completion_tokens
    details = usage.prompt_tokens_details
    record.cached_tokens = (details.cached_tokens or 0) if details else 0
