"""A streamed response's SSE events, parsed once when the response is complete.

While a response streams, the client only stamps each network read and keeps its bytes
(`stator.bench.http`); parsing every read as it arrived cost more than the rest of a
request. Here the whole body is split into `data:` events, each event taking the time of
the read that brought its line's end (when the client could first have seen it), and the
JSON payloads are decoded in one msgspec call.

The usual body (`data: {...}\\n\\n` events written whole, one or more per read, ending with
`data: [DONE]`) takes a path with no Python loop over events; anything else (CRLF line
ends, other SSE fields, comments, lines cut across reads, a stream cut short, bad JSON)
takes the general line-by-line path. Both give the same result.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate, chain, repeat
from typing import Any, NamedTuple

import msgspec

DONE = b"[DONE]"
_EVENT_END = repeat(b"\n\n")  # (an endless argument for `map`)
_NEXT_EVENT = b"\n\ndata: "
_LAST_EVENT = b",[DONE]\n\n"


class Events(NamedTuple):
    decoded: list[Any]  # the JSON payloads before `[DONE]`, in order, to the first bad one
    times: list[float]  # when each `data:` line was complete (`[DONE]`'s included)
    done: int | None  # the index of `[DONE]` in `times`, if it came
    error: msgspec.DecodeError | None  # why decoding stopped early, if it did


def parse(reads: list[bytes], times: list[float], decode_many: Any, decode_one: Any) -> Events:
    """The events of a body received as `reads` (read i arrived at `times[i]`).
    `decode_many` decodes a JSON list of payloads, `decode_one` one payload."""
    whole = _whole_events(reads, times)
    if whole is not None:
        array, when = whole
        try:
            decoded = decode_many(array)
        except msgspec.DecodeError:
            decoded = None
        if decoded is not None and len(decoded) == len(when) - 1:
            return Events(decoded, when, len(decoded), None)
    payloads, when = data_events(reads, times)
    done = payloads.index(DONE) if DONE in payloads else None
    decoded, error = decode_events(payloads[:done], decode_many, decode_one)
    return Events(decoded, when, done, error)


def _whole_events(reads: list[bytes], times: list[float]) -> tuple[bytes, list[float]] | None:
    """For a body of `data: X\\n\\n` events only, every read ending at an event's end and
    the last event `[DONE]`: the JSON list of the payloads before `[DONE]` and every
    event's time; else None."""
    if not all(map(bytes.endswith, reads, _EVENT_END)):
        return None
    body = b"".join(reads)
    joined = body.replace(_NEXT_EVENT, b",")
    # Every `\n` of such a body is in an event's `\n\n`, and all but the last were
    # replaced: so the first `\n` left is the second last byte.
    if body[:6] != b"data: " or joined[-9:] != _LAST_EVENT or joined.find(b"\n") != len(joined) - 2:
        return None
    events = (len(body) - len(joined)) // (len(_NEXT_EVENT) - 1) + 1
    if events == len(reads):  # one event per read, the most usual
        when = list(times)
    else:  # a read's events are its `\n\n`s
        when = list(chain.from_iterable(map(repeat, times, map(bytes.count, reads, _EVENT_END))))
    return b"[" + joined[6:-9] + b"]", when


def data_events(reads: list[bytes], times: list[float]) -> tuple[list[bytes], list[float]]:
    """The `data:` payloads of a body received as `reads`, line by line, and the time each
    payload's line was complete. Lines end at `\\n` (a `\\r` before it is stripped with the
    payload); blank lines, comments and other SSE fields are skipped; a line still open
    at the end of the body is not an event."""
    lines = b"".join(reads).split(b"\n")
    lines.pop()  # what follows the last line end: an unfinished line, or nothing
    ends = list(accumulate(map(len, reads)))  # the offset after read i's last byte
    payloads: list[bytes] = []
    when: list[float] = []
    end = -1
    for line in lines:
        end += len(line) + 1  # where this line's `\n` is
        if line[:5] == b"data:":
            payloads.append(line[5:].strip())
            when.append(times[bisect_right(ends, end)])
    return payloads, when


def decode_events(
    payloads: list[bytes], decode_many: Any, decode_one: Any
) -> tuple[list[Any], msgspec.DecodeError | None]:
    """Decode JSON payloads in one call of `decode_many`, falling back to one `decode_one`
    per payload to find the first undecodable one. Returns the decoded payloads, in
    order, and the first `msgspec.DecodeError` (None when all decoded); payloads after a
    bad one are dropped."""
    if not payloads:
        return [], None
    try:
        decoded = decode_many(b"[" + b",".join(payloads) + b"]")
    except msgspec.DecodeError:
        decoded = None
    if decoded is not None and len(decoded) == len(payloads):
        return decoded, None
    # A bad payload, or one that is several JSON values (`{}, {}` splices into the list):
    # decode each alone to say which.
    decoded = []
    for payload in payloads:
        try:
            decoded.append(decode_one(payload))
        except msgspec.DecodeError as exc:
            return decoded, exc
    return decoded, None
