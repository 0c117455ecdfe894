"""Building a Responses API response, and its stream of events, from parsed model deltas.

Feed the builder what the parsers produced (reasoning text, content text, tool-call deltas);
it opens and closes output items (`reasoning`, `message`, `function_call`) as the kind of
output changes and returns the documented events in order:

    response.created, response.in_progress,
    per item: response.output_item.added, [response.content_part.added],
              ….delta events (output_text / reasoning_text / function_call_arguments),
              ….done, [response.content_part.done], response.output_item.done,
    response.completed (or response.incomplete when output was cut at max_output_tokens).

Every event carries a `sequence_number`. The same builder gives the non-streaming response
(`builder.response`), so both modes describe the same output.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from stator.parsers.calls import ToolCallDelta

Event = dict[str, Any]


@dataclass
class ResponseUsage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def to_dict(self) -> dict:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {
                "cached_tokens": self.cached_tokens,
                "cache_write_tokens": 0,
            },
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    def __init__(
        self,
        model: str,
        *,
        response_id: str | None = None,
        created_at: int | None = None,
        request_echo: dict | None = None,
        id_factory=_new_id,
    ) -> None:
        """`request_echo`: request fields the response repeats (instructions, tools,
        tool_choice, temperature, top_p, max_output_tokens, reasoning, previous_response_id…)."""
        self._new_id = id_factory
        self.response: dict[str, Any] = {
            "id": response_id or id_factory("resp"),
            "object": "response",
            "created_at": created_at if created_at is not None else int(time.time()),
            "status": "in_progress",
            "model": model,
            "output": [],
            "usage": None,
            "error": None,
            "incomplete_details": None,
            **(request_echo or {}),
        }
        self._sequence = 0
        self._open: dict | None = None  # the output item being streamed
        self._open_kind = ""
        self._started = False

    # -- feeding ---------------------------------------------------------------------------

    def start(self) -> list[Event]:
        self._started = True
        return [
            self._event("response.created", response=self._snapshot()),
            self._event("response.in_progress", response=self._snapshot()),
        ]

    def add(
        self, reasoning: str = "", content: str = "", calls: list[ToolCallDelta] | tuple = ()
    ) -> list[Event]:
        events = [] if self._started else self.start()
        if reasoning:
            events += self._text("reasoning", reasoning)
        if content:
            events += self._text("message", content)
        for call in calls:
            events += self._call(call)
        return events

    def finish(
        self, usage: ResponseUsage | None = None, *, incomplete_reason: str | None = None
    ) -> list[Event]:
        """`incomplete_reason`: e.g. "max_output_tokens" when generation stopped on length."""
        events = [] if self._started else self.start()
        events += self._close()
        self.response["usage"] = (usage or ResponseUsage()).to_dict()
        if incomplete_reason:
            self.response["status"] = "incomplete"
            self.response["incomplete_details"] = {"reason": incomplete_reason}
            return [*events, self._event("response.incomplete", response=self._snapshot())]
        self.response["status"] = "completed"
        return [*events, self._event("response.completed", response=self._snapshot())]

    def fail(self, message: str, code: str = "server_error") -> list[Event]:
        events = [] if self._started else self.start()
        events += self._close()
        self.response["status"] = "failed"
        self.response["error"] = {"code": code, "message": message}
        return [*events, self._event("response.failed", response=self._snapshot())]

    # -- items -----------------------------------------------------------------------------

    def _text(self, kind: str, text: str) -> list[Event]:
        events = []
        if self._open_kind != kind:
            events += self._close()
            events += self._open_text_item(kind)
        item = self._open
        assert item is not None
        item["content"][0]["text"] += text
        delta_type = (
            "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        )
        extra = {"logprobs": []} if kind == "message" else {}
        events.append(
            self._event(delta_type, **self._where(), content_index=0, delta=text, **extra)
        )
        return events

    def _open_text_item(self, kind: str) -> list[Event]:
        if kind == "message":
            item = {
                "id": self._new_id("msg"),
                "type": "message",
                "role": "assistant",
                "content": [],
            }
            part = {"type": "output_text", "text": "", "annotations": []}
        else:
            item = {"id": self._new_id("rs"), "type": "reasoning", "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        item["status"] = "in_progress"
        events = self._add_item(kind, item)
        item["content"].append(dict(part))
        events.append(
            self._event("response.content_part.added", **self._where(), content_index=0, part=part)
        )
        return events

    def _call(self, call: ToolCallDelta) -> list[Event]:
        events = []
        if call.name is not None:  # the first delta of a call: a new item
            events += self._close()
            item = {
                "id": self._new_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "call_id": call.id or self._new_id("call"),
                "name": call.name,
                "arguments": "",
            }
            events += self._add_item("function_call", item)
        if call.arguments_fragment:
            if self._open_kind != "function_call":
                raise ValueError("tool-call arguments arrived before the call's name")
            self._open["arguments"] += call.arguments_fragment
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    **self._where(),
                    delta=call.arguments_fragment,
                )
            )
        return events

    def _add_item(self, kind: str, item: dict) -> list[Event]:
        self.response["output"].append(item)
        self._open, self._open_kind = item, kind
        snapshot = {**item, "content": []} if "content" in item else dict(item)
        return [
            self._event("response.output_item.added", output_index=self._index(), item=snapshot)
        ]

    def _close(self) -> list[Event]:
        item, kind = self._open, self._open_kind
        if item is None:
            return []
        events = []
        where = self._where()
        if kind == "function_call":
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        else:
            part = item["content"][0]
            done = (
                "response.output_text.done" if kind == "message" else "response.reasoning_text.done"
            )
            extra = {"logprobs": []} if kind == "message" else {}
            events.append(self._event(done, **where, content_index=0, text=part["text"], **extra))
            events.append(
                self._event("response.content_part.done", **where, content_index=0, part=dict(part))
            )
        item["status"] = "completed"
        events.append(
            self._event(
                "response.output_item.done", output_index=where["output_index"], item=_copy(item)
            )
        )
        self._open, self._open_kind = None, ""
        return events

    # -- helpers ---------------------------------------------------------------------------

    def _index(self) -> int:
        return len(self.response["output"]) - 1

    def _where(self) -> dict:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": self._index()}

    def _snapshot(self) -> dict:
        return _copy(self.response)

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def output_text(response: dict) -> str:
    """The SDK's `response.output_text`: all output_text parts joined."""
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
