"""The once-per-response SSE parse: events and their times however the body was cut into
reads, and one-call JSON decoding with an exact fallback."""

import itertools
import json
import random

import msgspec

from stator.bench.sse import DONE, data_events, decode_events, done_index


def stream(n: int, newline: bytes = b"\n") -> bytes:
    out = b": a comment" + newline + newline
    for i in range(n):
        out += b"event: x" + newline if i % 5 == 4 else b""
        out += b"data: " + json.dumps({"n": i, "s": "é\n"[: i % 2]}).encode() + newline + newline
    return out + b"data: [DONE]" + newline + newline


def expected(body: bytes, ends: list[int], times: list[float]) -> tuple[list, list]:
    """Line by line, the slow way: a `data:` line is an event at the time of the read that
    holds its line end."""
    payloads, when, pos = [], [], 0
    while (nl := body.find(b"\n", pos)) >= 0:
        line = body[pos:nl]
        if line.startswith(b"data:"):
            payloads.append(line[5:].strip())
            when.append(times[next(i for i, end in enumerate(ends) if nl < end)])
        pos = nl + 1
    return payloads, when


def test_events_and_times_match_a_line_by_line_parse_for_any_cuts():
    rng = random.Random(11)
    for newline in (b"\n", b"\r\n"):
        body = stream(12, newline)
        singles = [[cut] for cut in range(1, len(body))]
        randoms = [sorted(rng.sample(range(1, len(body)), rng.randint(2, 60))) for _ in range(200)]
        for cuts in [[], *singles, *randoms]:
            edges = [0, *cuts, len(body)]
            reads = [body[a:b] for a, b in itertools.pairwise(edges)]
            times = [float(i) for i in range(len(reads))]
            got = data_events(reads, times)
            assert got == expected(body, edges[1:], times), cuts
            assert len(got[0]) == 13 and got[0][-1] == DONE


def test_a_line_without_its_end_is_not_an_event():
    payloads, when = data_events([b'data: {"a": 1}\n\ndata: {"b"'], [3.0])
    assert payloads == [b'{"a": 1}'] and when == [3.0]
    assert data_events([b"data: x", b"y"], [1.0, 2.0]) == ([], [])
    assert data_events([b"data: x", b"y\n"], [1.0, 2.0]) == ([b"xy"], [2.0])


class Event(msgspec.Struct):
    n: int


many = msgspec.json.Decoder(list[Event]).decode
one = msgspec.json.Decoder(Event).decode


def test_decode_in_one_call_or_find_the_bad_payload():
    assert decode_events([], many, one) == ([], None)
    events, bad = decode_events([b'{"n": 1}', b'{"n":2}'], many, one)
    assert events == [Event(1), Event(2)] and bad is None
    events, bad = decode_events([b'{"n": 1}', b"{not json}", b'{"n": 3}'], many, one)
    assert events == [Event(1)] and isinstance(bad, msgspec.DecodeError)
    # A payload of two JSON values decodes as a list of the right length but is invalid.
    events, bad = decode_events([b'{"n": 1}, {"n": 2}', b'{"n": 3}'], many, one)
    assert events == [] and isinstance(bad, msgspec.DecodeError)
    events, bad = decode_events([b""], many, one)
    assert events == [] and isinstance(bad, msgspec.DecodeError)


def test_done_index():
    assert done_index([b"{}", DONE, b"{}"]) == 1
    assert done_index([b"{}"]) is None
