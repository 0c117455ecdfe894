"""The once-per-response SSE parse: events and their times however the body was cut into
reads, and one-call JSON decoding with an exact fallback."""

import itertools
import json
import random

import msgspec

from stator.bench.sse import DONE, _whole_events, data_events, decode_events, parse


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


def general(reads: list[bytes], times: list[float]) -> tuple:
    """What `parse` must give: the line-by-line path alone."""
    payloads, when = data_events(reads, times)
    done = payloads.index(DONE) if DONE in payloads else None
    decoded, error = decode_events(payloads[:done], many, one)
    return decoded, when, done, type(error)


def event_cuts(body: bytes, rng: random.Random) -> list[int]:
    """Cuts after some of the events' blank lines (each read whole events)."""
    ends = [i + 2 for i in range(len(body) - 1) if body[i : i + 2] == b"\n\n"]
    return sorted(rng.sample(ends[:-1], rng.randint(0, max(0, len(ends) - 1))))


def test_parse_whole_events_in_one_go_and_agree_with_the_line_by_line_path():
    rng = random.Random(3)
    good = b"".join(b'data: {"n": %d}\n\n' % i for i in range(9)) + b"data: [DONE]\n\n"
    bodies = {
        "whole": good,
        "bad json": good.replace(b'{"n": 4}', b"{not json}"),
        "two values": good.replace(b'{"n": 4}', b'{"n": 4}, {"n": 5}'),
        "done in a payload": good.replace(b"data: [DONE]", b'data: {"n": 9},[DONE]'),
        "after done": good + b'data: {"n": 10}\n\n',
        "no done": good.replace(b"data: [DONE]\n\n", b""),
        "only done": b"data: [DONE]\n\n",
        "crlf": good.replace(b"\n", b"\r\n"),
        "no space": good.replace(b"data: ", b"data:"),
        "comment": b": hi\n\n" + good,
        "other field": good.replace(b'data: {"n": 2}', b'event: x\ndata: {"n": 2}'),
        "extra blank line": good.replace(b'\n\ndata: {"n": 3}', b'\n\n\ndata: {"n": 3}'),
    }
    fast = 0
    for name, body in bodies.items():
        for trial in range(40):
            cuts = (
                event_cuts(body, rng) if trial % 2 else sorted(rng.sample(range(1, len(body)), 5))
            )
            edges = [0, *cuts, len(body)]
            reads = [body[a:b] for a, b in itertools.pairwise(edges)]
            times = [float(i) for i in range(len(reads))]
            events = parse(reads, times, many, one)
            got = (events.decoded, events.times, events.done, type(events.error))
            assert got == general(reads, times), (name, cuts)
            fast += _whole_events(reads, times) is not None
    assert fast >= 20  # the one-go path did run (and agreed)
    events = parse([good[:20], good[20:]], [1.0, 2.0], many, one)
    assert events.decoded == [Event(i) for i in range(9)] and events.done == 9
    assert events.times == [1.0] + [2.0] * 9 and events.error is None
    one_each = [event + b"\n\n" for event in good.split(b"\n\n")[:-1]]
    events = parse(one_each, [float(i) for i in range(10)], many, one)
    assert events.times == [float(i) for i in range(10)] and events.done == 9
    assert _whole_events(one_each, [0.0] * 10) is not None
