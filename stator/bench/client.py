"""One request over HTTP, timed: the client's hot path.

While a response streams, each network read costs one `perf_counter()` and keeps its
bytes; the SSE events are parsed and decoded (one typed msgspec call that reads only the
fields we need) once the response is complete, each event timed by the read that
completed it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from stator.bench import sse
from stator.bench.http import HttpClient, HttpError


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


# The decoded events are short-lived and hold no reference cycles: `gc=False` keeps them
# out of the garbage collector's books (about a tenth of the parse cost per response).
class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Any] | None = None


class _Choice(msgspec.Struct, gc=False):
    delta: _Delta | None = None
    message: _Delta | None = None
    text: str | None = None


class _Details(msgspec.Struct, gc=False):
    cached_tokens: int | None = 0


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: _Details | None = None


class _Chunk(msgspec.Struct, gc=False):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: Any = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_decode_chunks = msgspec.json.Decoder(list[_Chunk]).decode


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
    http: HttpClient,
    path: str,
    body: dict[str, Any],
    record: RequestRecord,
    keep_text: bool = False,
    timeout: float = 600.0,
) -> RequestRecord:
    """POST `body` to `path` and fill `record` with timings, usage and status."""
    clock = time.perf_counter
    t0 = clock()
    pieces: list[str] = []
    resp = None
    try:
        async with asyncio.timeout(timeout):
            resp = await http.request("POST", path, _encode(body), head_timeout=False)
            record.status = resp.status
            if resp.status != 200:
                record.error = (await resp.read()).decode(errors="replace")[:500]
            elif body.get("stream"):
                await _read_stream(resp, record, t0, pieces if keep_text else None)
            else:
                chunk = _decode_chunk(await resp.read())
                record.ttft = record.latency = clock() - t0
                _apply_usage(record, chunk.usage)
                if keep_text and chunk.choices:
                    pieces.append(_choice_text(chunk.choices[0]))
    except (HttpError, TimeoutError, msgspec.DecodeError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    finally:
        if resp is not None:
            http.release(resp)
    if record.latency is None and record.error is None:
        record.latency = clock() - t0
    record.text = "".join(pieces)
    return record


async def _read_stream(
    resp: Any, record: RequestRecord, t0: float, pieces: list[str] | None
) -> None:
    """Wait for the whole stream (the connection only stamps and keeps each read), then
    parse it once; a connection cut after `data: [DONE]` loses nothing."""
    resp.time_reads()
    try:
        await resp.wait()
    except HttpError:
        if not _parse_stream(resp, record, t0, pieces):
            raise
        return
    _parse_stream(resp, record, t0, pieces)


def _parse_stream(resp: Any, record: RequestRecord, t0: float, pieces: list[str] | None) -> bool:
    """Fill `record` from the body received so far; True if it reached `[DONE]`."""
    events = sse.parse(*resp.timed_reads(), _decode_chunks, _decode_chunk)
    when = events.times
    times = record.chunk_times
    for chunk, at in zip(events.decoded, when, strict=False):
        if chunk.error is not None:
            record.error = str(chunk.error)[:500]
            break
        for choice in chunk.choices:
            if _has_output(choice):
                times.append(at - t0)
                if pieces is not None:
                    pieces.append(_choice_text(chunk.choices[0]))
                break
        if chunk.usage is not None:
            _apply_usage(record, chunk.usage)
    else:
        if events.error is not None:
            record.error = f"undecodable event: {events.error}"
        elif events.done is not None:
            record.latency = when[events.done] - t0
    if times:
        record.ttft = times[0]
        record.ttst = times[1] if len(times) > 1 else None
    if record.latency is None and record.error is None:
        record.error = "stream ended before data: [DONE]"
    if record.latency is None:
        record.latency = time.perf_counter() - t0
    return events.done is not None


_encode = msgspec.json.Encoder().encode


def _apply_usage(record: RequestRecord, usage: _Usage | None) -> None:
    if usage is None:
        return
    record.input_tokens = usage.prompt_tokens
    record.output_tokens = usage.completion_tokens
    details = usage.prompt_tokens_details
    record.cached_tokens = (details.cached_tokens or 0) if details else 0
