"""The streaming reader of `stator bench`: SSE events however the bytes are cut."""

import asyncio
import bisect
import functools
import itertools
import json
import random

from aiohttp import web
from aiohttp.test_utils import TestServer

from stator.bench.client import RequestRecord, _parse_stream, send
from stator.bench.http import HttpClient


def sse_events(texts: list[str], usage: dict, newline: bytes = b"\n") -> bytes:
    out = b""
    for i, text in enumerate(texts):
        delta = {"role": "assistant", "content": text} if i == 0 else {"content": text}
        event = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        out += b"data: " + json.dumps(event).encode() + newline + newline
    out += b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + newline + newline
    return out + b"data: [DONE]" + newline + newline


async def read_with_cuts(body: bytes, cuts: list[int]) -> RequestRecord:
    """Serve `body` as an SSE response written in pieces cut at `cuts`, read it back."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        edges = [0, *cuts, len(body)]
        for a, b in itertools.pairwise(edges):
            await resp.write(body[a:b])
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    async with TestServer(app, host="127.0.0.1") as server:
        http = HttpClient(str(server.make_url("")))
        record = RequestRecord(index=0, start=0.0)
        try:
            return await send(http, "/v1/chat/completions", {"stream": True}, record, True)
        finally:
            http.close()


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}


async def test_events_cut_anywhere_are_all_read():
    body = sse_events(["Hé", "llo", " wörld"], USAGE)
    for cuts in ([], [1], [5, 6, 7], list(range(1, len(body), 3)), list(range(1, len(body)))):
        record = await read_with_cuts(body, cuts)
        assert record.ok, (cuts, record.error)
        assert record.text == "Héllo wörld"
        assert len(record.chunk_times) == 3
        assert (record.input_tokens, record.output_tokens, record.cached_tokens) == (7, 3, 2)
        assert record.ttft == record.chunk_times[0] <= record.ttst <= record.latency


async def test_crlf_line_ends():
    record = await read_with_cuts(sse_events(["a", "b"], USAGE, newline=b"\r\n"), [10])
    assert record.ok and record.text == "ab" and len(record.chunk_times) == 2


async def test_stream_without_done_is_an_error():
    body = sse_events(["a"], USAGE).replace(b"data: [DONE]\n\n", b"")
    record = await read_with_cuts(body, [4])
    assert record.error == "stream ended before data: [DONE]"


async def test_error_event_stops_the_read():
    body = b'data: {"error": {"message": "boom"}}\n\ndata: [DONE]\n\n'
    record = await read_with_cuts(body, [3])
    assert record.error is not None and "boom" in record.error


async def test_one_event_per_read_and_odd_spacing():
    """Reads that are exactly one event take a shortcut; it must agree with the general
    path, including the role-only first event (no output) and the usage event."""
    body = sse_events(["a", "", "b", "c"], USAGE)
    edges = [i + 2 for i in range(len(body)) if body[i : i + 2] == b"\n\n"][:-1]
    record = await read_with_cuts(body, edges)
    assert record.ok and len(record.chunk_times) == 3 and record.output_tokens == 3
    spaced = body.replace(b"data: ", b"data:  ").replace(b'":', b'": ')
    record = await read_with_cuts(spaced, [i + 1 for i in edges])
    assert record.ok and len(record.chunk_times) == 3 and record.cached_tokens == 2
    crlf = sse_events(["a", "b"], USAGE, newline=b"\r\n")
    record = await read_with_cuts(
        crlf, [i + 4 for i in range(len(crlf)) if crlf[i : i + 4] == b"\r\n\r\n"]
    )
    assert record.ok and len(record.chunk_times) == 2


async def test_garbage_event_in_its_own_read_is_an_error():
    body = sse_events(["a"], USAGE)
    bad = body.replace(b"data: [DONE]", b"data: {not json}\n\ndata: [DONE]")
    record = await read_with_cuts(bad, [bad.index(b"data: {not")])
    assert record.error is not None and "undecodable" in record.error


class Received:
    """A response already received: its body as reads, with their arrival times (what
    `_parse_stream` reads from the connection)."""

    def __init__(self, reads: list[bytes], times: list[float]) -> None:
        self.reads, self.times = reads, times

    def timed_reads(self) -> tuple[list[bytes], list[float]]:
        return self.reads, self.times


def test_each_event_takes_the_time_of_the_read_that_completed_it():
    body = sse_events(["a", "", "b"], USAGE)
    events = [e + b"\n\n" for e in body.split(b"\n\n")[:-1]]
    record = RequestRecord(index=0, start=0.0)
    assert _parse_stream(Received(events, [1.0, 2.0, 3.0, 4.0, 5.0]), record, 1.0, None)
    assert record.error is None and record.chunk_times == [0.0, 2.0] and record.latency == 4.0
    assert (record.ttft, record.ttst) == (0.0, 2.0)
    assert (record.input_tokens, record.output_tokens) == (7, 3)
    # The first event's line cut before its `\n`: complete at the second read.
    first = events[0]
    reads = [first[:-2], first[-2:-1], first[-1:] + events[1], *events[2:]]
    record = RequestRecord(index=0, start=0.0)
    assert _parse_stream(Received(reads, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]), record, 0.0, None)
    assert record.chunk_times == [1.0, 3.0] and record.latency == 5.0


def test_a_stream_cut_short_is_parsed_up_to_where_it_stopped():
    body = sse_events(["a", "b", "c"], USAGE)
    cut = body.index(b"data:", body.index(b'"b"'))  # after the second output event
    record = RequestRecord(index=0, start=0.0)
    assert not _parse_stream(Received([body[:cut]], [0.5]), record, 0.0, None)
    assert record.chunk_times == [0.5, 0.5] and record.ttst == 0.5
    assert record.error == "stream ended before data: [DONE]"


async def test_event_times_are_the_arrival_of_the_read_that_completed_each_line(monkeypatch):
    """Through the connection itself: the raw response (head, chunk framing, events) cut
    into reads anywhere, each read stamped with a scripted clock; every output event must
    carry the time of the read that brought its `data:` line's `\\n`."""
    from stator.bench import http as http_module

    body = sse_events(["a", "b", "", "c", "d"], USAGE)
    events = [e + b"\n\n" for e in body.split(b"\n\n")[:-1]]
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    raw = head + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    # where each output event's line ends in `raw` (its first `\n`); "" is not an output
    outputs = [e for e in events[:5] if b'"content": ""' not in e]
    output_ends = [raw.index(e) + e.index(b"\n") for e in outputs]
    assert len(output_ends) == 4
    rng = random.Random(9)
    cut_sets = [[len(head)], [len(head) + 1], list(range(1, len(raw)))]
    cut_sets += [sorted(rng.sample(range(1, len(raw)), rng.randint(1, 40))) for _ in range(150)]
    for cuts in cut_sets:
        edges = [0, *cuts, len(raw)]
        reads = [raw[a:b] for a, b in itertools.pairwise(edges)]
        clock = iter([float(k) for k in range(len(reads))])
        monkeypatch.setattr(http_module, "_clock", functools.partial(next, clock))
        resp = http_module._Response()
        i = 0
        while not resp._head_done.done():
            resp.data_received(reads[i])
            i += 1
        resp.time_reads()
        for data in reads[i:]:
            resp.data_received(data)
        await asyncio.wait_for(resp.wait(), 5)
        record = RequestRecord(index=0, start=0.0)
        assert _parse_stream(resp, record, 0.0, None)
        expected = [float(bisect.bisect_right(edges, end) - 1) for end in output_ends]
        assert record.chunk_times == expected, cuts
        assert record.latency == float(bisect.bisect_right(edges, raw.index(b"[DONE]") + 6) - 1)
        assert (record.input_tokens, record.output_tokens) == (7, 3)
