"""A streamed response's SSE events, parsed once when the response is complete.

While a response streams, the client only stamps each network read and keeps its bytes
(`stator.bench.http`); parsing every read as it arrives cost more than the rest of a
request. Here the whole body is split into `data:` events in one pass, each event taking
the time of the read that brought its line's last byte (when the client could first have
seen it), and every JSON payload is decoded in one msgspec call.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import accumulate
from typing import Any

import msgspec

# A complete `data:` line (the `\n` has arrived); the payload is stripped by the caller.
# Blank separators, comments and other SSE fields are skipped.
_DATA_LINE = re.compile(rb"^data:([^\n]*)\n", re.MULTILINE)
DONE = b"[DONE]"


def data_events(reads: list[bytes], times: list[float]) -> tuple[list[bytes], list[float]]:
    """The `data:` payloads of a body received as `reads` (read i arrived at `times[i]`),
    and the time each payload's line was complete. A line still open at the end of the
    body is not an event."""
    body = b"".join(reads)
    if len(reads) == 1:  # (the whole response in one read: no offsets to map)
        payloads = [p.strip() for p in _DATA_LINE.findall(body)]
        return payloads, [times[0]] * len(payloads)
    ends = list(accumulate(map(len, reads)))  # offset after read i's last byte
    payloads: list[bytes] = []
    when: list[float] = []
    for match in _DATA_LINE.finditer(body):
        payloads.append(match[1].strip())
        when.append(times[bisect_right(ends, match.end() - 1)])
    return payloads, when


def done_index(payloads: list[bytes]) -> int | None:
    """Where the stream's `data: [DONE]` is, if it came."""
    return payloads.index(DONE) if DONE in payloads else None


def decode_events(
    payloads: list[bytes], decode_many: Any, decode_one: Any
) -> tuple[list, msgspec.DecodeError | None]:
    """Decode JSON payloads in one call of `decode_many` (a msgspec decoder of a list),
    falling back to one `decode_one` per payload to find the first undecodable one.
    Returns the decoded events, in order, and the first `msgspec.DecodeError` (None when
    all decoded); events after a bad one are dropped."""
    if not payloads:
        return [], None
    try:
        events = decode_many(b"[" + b",".join(payloads) + b"]")
    except msgspec.DecodeError:
        events = None
    if events is not None and len(events) == len(payloads):
        return events, None
    # A bad payload, or one that is several JSON values (`{}, {}` splices into the list):
    # decode each alone to say which.
    events = []
    for payload in payloads:
        try:
            events.append(decode_one(payload))
        except msgspec.DecodeError as exc:
            return events, exc
    return events, None
