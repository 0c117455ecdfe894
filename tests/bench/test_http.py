"""The benchmark's HTTP/1.1 client: response parsing however the bytes are cut, keep-alive
reuse, and failures reported as errors (never a hang)."""

import asyncio
import itertools
import random

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from stator.bench.client import RequestRecord, send
from stator.bench.http import HttpClient, HttpError, _Response
from tests.procs import free_port


def chunked(parts: list[bytes]) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return body + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def feed(raw: bytes, cuts: list[int]) -> tuple[_Response, bytes]:
    resp = _Response()
    edges = [0, *sorted(set(cuts)), len(raw)]
    for a, b in itertools.pairwise(edges):
        if b > a:
            resp.data_received(raw[a:b])
    await resp.head()
    return resp, await resp.read()


async def test_chunked_body_cut_anywhere():
    parts = [b"data: one\n\n", b"data: two\n\n", b"x" * 300, b"data: [DONE]\n\n"]
    raw = HEAD + chunked(parts)
    rng = random.Random(5)
    for _ in range(200):
        cuts = rng.sample(range(1, len(raw)), rng.randint(0, 25))
        resp, body = await feed(raw, cuts)
        assert resp.status == 200 and resp.finished and body == b"".join(parts)
    for cut in range(1, len(raw)):
        assert (await feed(raw, [cut]))[1] == b"".join(parts)


async def test_content_length_body_and_close_header():
    raw = b'HTTP/1.1 404 Not Found\r\nContent-Length: 11\r\nConnection: close\r\n\r\n{"error":1}'
    resp, body = await feed(raw, [20, 70])
    assert resp.status == 404 and body == b'{"error":1}' and not resp.keep_alive


async def test_malformed_head_is_an_error():
    resp = _Response()
    resp.data_received(b"SMTP ready\r\n\r\n")
    with pytest.raises(HttpError):
        await resp.head()


async def test_against_a_server_keep_alive_and_failures():
    calls = []

    async def handler(request: web.Request) -> web.StreamResponse:
        calls.append(await request.read())
        if request.path == "/slow":
            await asyncio.sleep(5)
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(3):
            await resp.write(b"piece%d;" % i)
        return resp

    app = web.Application()
    app.router.add_post("/{name}", handler)
    async with TestServer(app, host="127.0.0.1") as server:
        http = HttpClient(str(server.make_url("")), timeout=5)
        for _ in range(3):
            resp = await http.request("POST", "/a", b'{"k": 1}')
            assert await resp.read() == b"piece0;piece1;piece2;"
            http.release(resp)
        assert len(http._idle) == 1  # one connection, reused
        assert calls == [b'{"k": 1}'] * 3
        # A request past its time limit is an error on its record, not a hang.
        record = await send(http, "/slow", {}, RequestRecord(index=0, start=0.0), timeout=0.3)
        assert record.error is not None and "Timeout" in record.error
        http.close()
    refused = HttpClient(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(HttpError, match="cannot connect"):
        await refused.request("GET", "/")
    with pytest.raises(ValueError):
        HttpClient("https://example.invalid")


async def read_timed(raw: bytes, cuts: list[int]) -> tuple[bytes, int]:
    """Feed `raw` cut at `cuts`, the body kept per read as `send` does; the body and
    how many times the waiting reader was woken."""
    resp = _Response()
    edges = [0, *sorted(set(cuts)), len(raw)]
    reads = [raw[a:b] for a, b in itertools.pairwise(edges) if b > a]
    while not resp._head_done.done():
        resp.data_received(reads.pop(0))
    resp.time_reads()
    waiter = asyncio.ensure_future(resp.wait())
    await asyncio.sleep(0)
    wakes = 0
    original = resp._signal

    def counting_signal() -> None:
        nonlocal wakes
        wakes += 1
        original()

    resp._signal = counting_signal
    for data in reads:
        assert not waiter.done()
        resp.data_received(data)
        await asyncio.sleep(0)
    await asyncio.wait_for(waiter, 5)
    pieces, times = resp.timed_reads()
    assert len(pieces) == len(times) and all(pieces)  # one non-empty piece per timed read
    assert times == sorted(times)
    return b"".join(pieces), wakes if reads else 1  # (no read left: it ended with the head)


async def test_timed_reads_keep_every_byte_and_the_reader_wakes_once():
    parts = [b'data: {"n": %d}\n\n' % i for i in range(12)] + [b"x" * 40]
    raw = HEAD + chunked(parts)
    starts = [raw.find(b"%x\r\n" % len(p), len(HEAD)) for p in parts]
    boundaries = sorted({raw.index(p) + len(p) + 2 for p in parts})  # after each chunk's CRLF
    rng = random.Random(7)
    cut_sets = [boundaries, [len(HEAD), *boundaries], [len(HEAD) + 3, *boundaries[4:]]]
    cut_sets += [boundaries[::2], boundaries[1::3], [len(HEAD), *boundaries[::4]]]  # whole chunks
    cut_sets += [sorted(rng.sample(range(1, len(raw)), rng.randint(1, 30))) for _ in range(100)]
    for cuts in cut_sets:
        body, wakes = await read_timed(raw, cuts)
        assert body == b"".join(parts), cuts
        assert wakes == 1, cuts  # at the end only, not once per read
    assert starts  # the chunk framing above was found where expected


async def test_timed_read_reports_a_bad_chunk_size():
    resp = _Response()
    resp.data_received(HEAD)
    resp.time_reads()
    resp.data_received(b"zz\r\ndata: x\r\n")
    with pytest.raises(HttpError, match="malformed"):
        await asyncio.wait_for(resp.wait(), 5)
    bads = [b"-1\r\nx\r\n", b"+1\r\nx\r\n", b"1_0\r\n" + b"x" * 16 + b"\r\n"]
    bads += [b"3\r\nabc\r\n-1\r\nx\r\n", b"3\r\nabc\r\nzz\r\nx\r\n", b"3\r\nabc\r\n+1\r\nx\r\n"]
    for bad in bads:
        resp = _Response()
        resp.data_received(HEAD)
        resp.time_reads()
        resp.data_received(bad)
        with pytest.raises(HttpError, match="malformed"):
            await asyncio.wait_for(resp.wait(), 5)


async def test_response_ends_only_after_the_last_chunks_line_end_and_trailers():
    raw = HEAD + chunked([b"abc"])
    resp = _Response()
    resp.data_received(raw[:-2])
    assert not resp.finished  # the empty line after `0` is still to come
    resp.data_received(raw[-2:])
    assert resp.finished and resp._raw == b""
    with_trailer = raw[:-2] + b"X-Checksum: 1\r\n\r\n"
    resp, body = await feed(with_trailer, [len(with_trailer) - 5])
    assert resp.finished and body == b"abc"


async def test_a_kept_alive_connection_closed_under_a_request_is_retried_once():
    """The server closes an idle kept-alive connection (its keep-alive timeout) just as the
    next request goes out on it: no byte of a response came, so the client sends the
    request again on a new connection. A new connection that closes is an error."""
    served: list[int] = []
    close_all = False

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        on_this_connection = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                served.append(on_this_connection)
                if close_all or on_this_connection == 1:
                    return  # closes the connection without an answer
                on_this_connection += 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except asyncio.IncompleteReadError:
            return
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        http = HttpClient(f"http://127.0.0.1:{port}", timeout=5)
        for _ in range(2):
            resp = await http.request("POST", "/a", b"{}")
            assert await resp.read() == b"ok"
            http.release(resp)
        # The second request met the closing connection and went again on a new one.
        assert served == [0, 1, 0]
        close_all = True
        with pytest.raises(HttpError):  # kept alive: closed, retried, closed again
            await http.request("POST", "/a", b"{}")
        assert len(served) == 5
        with pytest.raises(HttpError):  # a new connection that closes: no retry
            await http.request("POST", "/a", b"{}")
        assert len(served) == 6
        http.close()
    finally:
        server.close()
        await server.wait_closed()
