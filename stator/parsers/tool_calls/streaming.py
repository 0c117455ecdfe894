"""The shared streaming machine: content outside tool-call regions, calls inside.

A format says where a region starts (`start_markers`), where it ends (`end_marker`, or None
for "the rest of the output") and how to turn a region's text into calls. Text that may be the
start of a start marker is held back (jailed); a region is emitted as calls only when it is
complete, so a call is never streamed and then withdrawn. A region whose text does not parse
is reported as content with its markers removed: the model's words are kept, markers never
reach the client. End and inner markers met outside a region are dropped for the same reason.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

from stator.parsers.jail import find_first, partial_marker_len
from stator.parsers.tool_calls.base import (
    ToolCall,
    ToolCallDelta,
    ToolDelta,
    assemble_calls,
    normalize_arguments,
)

# (name, arguments) pairs parsed from a region; arguments is a dict or JSON string.
ParsedCalls = list[tuple[str, object]]


class MalformedToolCall(ValueError):
    pass


class RegionToolParser(abc.ABC):
    start_markers: tuple[str, ...] = ()
    end_marker: str | None = None
    # Inner markers: stripped from a malformed region before it is shown as content.
    all_markers: tuple[str, ...] = ()

    def __init__(self, *, tools: list[dict], id_factory: Callable[[], str]) -> None:
        self.tools = tools
        self._new_id = id_factory
        self._buffer = ""
        self._in_region = False
        self._region_marker = ""
        self._scanned = 0  # region text already searched for the end marker
        self._next_index = 0
        # End and inner markers outside a region are strays (a confused model): dropped,
        # since marker text never reaches content.
        self._strays = tuple(m for m in (self.end_marker, *self.all_markers) if m)
        self._outside_markers = (*self.start_markers, *self._strays)

    @abc.abstractmethod
    def parse_region(self, start_marker: str, body: str, *, complete: bool) -> ParsedCalls:
        """Calls in one region (`complete`: its end marker was seen). Raise MalformedToolCall."""

    # -- streaming --------------------------------------------------------------------

    def feed(self, text_delta: str) -> ToolDelta:
        self._buffer += text_delta
        out = ToolDelta()
        while True:
            if not self._in_region:
                hit = find_first(self._buffer, self._outside_markers)
                if hit is None:
                    keep = partial_marker_len(self._buffer, self._outside_markers)
                    out.content += self._buffer[: len(self._buffer) - keep]
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    return out
                pos, marker = hit
                out.content += self._buffer[:pos]
                self._buffer = self._buffer[pos + len(marker) :]
                if marker in self._strays:
                    continue
                self._in_region, self._region_marker = True, marker
            if self.end_marker is None:
                return out
            # Resume the search where the last one stopped: a long region is scanned once.
            end = self._buffer.find(self.end_marker, self._scanned)
            if end < 0:
                self._scanned = max(0, len(self._buffer) - len(self.end_marker) + 1)
                return out
            self._scanned = 0
            body = self._buffer[:end]
            self._buffer = self._buffer[end + len(self.end_marker) :]
            self._in_region = False
            out += self._emit(self._region_marker, body, complete=True)

    def finish(self) -> ToolDelta:
        out = ToolDelta()
        if self._in_region:
            out += self._emit(self._region_marker, self._buffer, complete=False)
        else:
            out.content += self._buffer
        self._buffer = ""
        self._in_region = False
        self._scanned = 0
        return out

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        delta = self.feed(text) + self.finish()
        return delta.content, assemble_calls(delta.calls)

    def _emit(self, marker: str, body: str, *, complete: bool) -> ToolDelta:
        try:
            parsed = self.parse_region(marker, body, complete=complete)
            calls = [(name, normalize_arguments(args)) for name, args in parsed]
        except (MalformedToolCall, ValueError, TypeError):
            return ToolDelta(content=self._strip_markers(body))
        out = ToolDelta()
        for name, arguments in calls:
            if not isinstance(name, str) or not name:
                return ToolDelta(content=self._strip_markers(body))
            index, self._next_index = self._next_index, self._next_index + 1
            out.calls.append(ToolCallDelta(index, self._new_id(), name, ""))
            out.calls.append(ToolCallDelta(index, None, None, arguments))
        return out

    def _strip_markers(self, text: str) -> str:
        for marker in (*self.start_markers, *self.all_markers):
            if self.end_marker:
                text = text.replace(self.end_marker, "")
            text = text.replace(marker, "")
        return text
