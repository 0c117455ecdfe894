"""Routing Harmony messages, fed as text and markers, into reasoning, content and tool calls.

Both the token-id parser and the text parser reduce their input to a sequence of "marker"
and "text" items and feed this one machine, so both agree by construction.

The completion starts right after the prompt's `<|start|>assistant`, so the machine starts in
a header. A header ends at `<|message|>`; its channel, recipient (`to=`, in the role part or
after the channel) and `<|constrain|>` type are parsed as the Harmony reference does. Then:
  - `analysis` (and calls to built-in tools) → reasoning, never content;
  - `final`, and `commentary` without a recipient (a preamble) → content;
  - a recipient `functions.NAME` → a tool call, emitted whole when the message ends (by
    `<|call|>`, `<|end|>` or `<|return|>`; at end of output only if its arguments are JSON),
    so a call is never streamed and then withdrawn.
Markers never reach reasoning or content. Text outside any message is dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from stator.parsers.calls import ToolCallDelta, new_call_id
from stator.parsers.harmony.special_tokens import (
    CALL,
    CHANNEL,
    CONSTRAIN,
    END,
    MESSAGE,
    RETURN,
    START,
)

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class HarmonyDelta:
    reasoning: str = ""
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def __add__(self, other: HarmonyDelta) -> HarmonyDelta:
        return HarmonyDelta(
            self.reasoning + other.reasoning, self.content + other.content, self.calls + other.calls
        )


@dataclass
class HarmonyHeader:
    role: str
    name: str | None = None
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None


def parse_header(text: str, default_role: str | None = None) -> HarmonyHeader:
    """A header's text (markers written out) → its fields. Tolerant: never raises."""
    channel = None
    pos = text.find(CHANNEL)
    if pos >= 0:
        after = text[pos + len(CHANNEL) :]
        stop = next((i for i, ch in enumerate(after) if ch.isspace() or ch == "<"), len(after))
        channel = after[:stop] or None
        text = text[:pos] + after[stop:]
    text = text.replace(CONSTRAIN, f" {CONSTRAIN}").strip()
    parts = text.split()
    role, name = default_role, None
    if default_role is None and parts:
        first = parts.pop(0)
        role = first if first in ROLES else "tool"
        name = None if first in ROLES else first
    elif parts and parts[0] == default_role:
        parts.pop(0)
    recipient = content_type = None
    if parts:
        last = parts.pop()
        if last.startswith("to="):
            recipient = last[3:]
        elif not parts:
            recipient = last
        else:
            content_type = last
            raw = parts.pop()
            recipient = raw.removeprefix("to=")
    return HarmonyHeader(role or "assistant", name, channel, recipient, content_type)


_HEADER, _CONTENT, _OUTSIDE = "header", "content", "outside"


class HarmonyMessageMachine:
    def __init__(self, id_factory: Callable[[], str] = new_call_id) -> None:
        self._new_id = id_factory
        self._state = _HEADER
        self._header_text = ""
        self._header: HarmonyHeader | None = None
        self._first_header = True
        self._call_arguments = ""
        self._next_index = 0
        self.messages_done = 0

    def marker(self, marker: str) -> HarmonyDelta:
        out = HarmonyDelta()
        if self._state == _HEADER:
            if marker == MESSAGE:
                default_role = "assistant" if self._first_header else None
                self._header = parse_header(self._header_text, default_role)
                self._first_header = False
                self._state = _CONTENT
                self._call_arguments = ""
            elif marker in (CHANNEL, CONSTRAIN):
                self._header_text += marker
            elif marker == START:
                self._header_text = ""
                self._first_header = False
            else:  # a header cut short by an end marker: nothing to show
                self._state = _OUTSIDE
        elif self._state == _CONTENT:
            if marker in (END, CALL, RETURN):
                out += self._end_message(complete=True)
                self._state = _OUTSIDE
            elif marker == START:
                out += self._end_message(complete=False)
                self._start_header()
            # Other markers inside content are protocol noise: never shown.
        elif marker == START:
            self._start_header()
        elif marker == CHANNEL:
            # A message that starts at a bare <|channel|> (no <|start|>role): assume assistant.
            self._start_header()
            self._first_header = True
            self._header_text = CHANNEL
        return out

    def text(self, text: str) -> HarmonyDelta:
        if self._state == _HEADER:
            self._header_text += text
            return HarmonyDelta()
        if self._state != _CONTENT or self._header is None:
            return HarmonyDelta()
        route = self._route()
        if route == "call":
            self._call_arguments += text
            return HarmonyDelta()
        if route == "reasoning":
            return HarmonyDelta(reasoning=text)
        if route == "content":
            return HarmonyDelta(content=text)
        return HarmonyDelta()

    def finish(self) -> HarmonyDelta:
        if self._state == _CONTENT:
            self._state = _OUTSIDE
            return self._end_message(complete=False)
        never_spoke_harmony = not any(m in self._header_text for m in (CHANNEL, CONSTRAIN))
        if self._state == _HEADER and self._first_header and never_spoke_harmony:
            # The output has no Harmony structure at all: its words are the answer.
            text, self._header_text = self._header_text, ""
            return HarmonyDelta(content=text)
        return HarmonyDelta()

    def _start_header(self) -> None:
        self._state = _HEADER
        self._header_text = ""
        self._first_header = False

    def _route(self) -> str:
        header = self._header
        assert header is not None
        if header.role != "assistant":
            return "drop"
        if header.recipient and header.recipient not in ("all", "assistant", "user"):
            return "call" if header.recipient.startswith("functions.") else "reasoning"
        if header.channel == "analysis":
            return "reasoning"
        return "content"

    def _end_message(self, *, complete: bool) -> HarmonyDelta:
        self.messages_done += 1
        if self._header is None or self._route() != "call":
            return HarmonyDelta()
        arguments, self._call_arguments = self._call_arguments.strip(), ""
        if not complete:
            try:
                json.loads(arguments)
            except json.JSONDecodeError:
                return HarmonyDelta()  # a call cut off mid-arguments cannot be executed
        name = self._header.recipient.removeprefix("functions.")
        index, self._next_index = self._next_index, self._next_index + 1
        return HarmonyDelta(
            calls=[
                ToolCallDelta(index, self._new_id(), name, ""),
                ToolCallDelta(index, None, None, arguments or "{}"),
            ]
        )
