"""Tool-call value types with OpenAI semantics, shared by every parser (Harmony included)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    """One complete call: `arguments_json` is a JSON object as a string, as OpenAI sends it."""

    id: str
    name: str
    arguments_json: str


@dataclass
class ToolCallDelta:
    """One streamed piece of a call. The first piece of a call carries id and name (OpenAI
    sends `type: "function"` with them); later pieces carry argument fragments only."""

    index: int
    id: str | None
    name: str | None
    arguments_fragment: str = ""


@dataclass
class ToolDelta:
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def __add__(self, other: ToolDelta) -> ToolDelta:
        return ToolDelta(self.content + other.content, self.calls + other.calls)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def normalize_arguments(arguments: Any) -> str:
    """Arguments as a JSON object string: models emit a dict, or a JSON string of one."""
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ValueError(f"tool arguments must be a JSON object, got {type(arguments).__name__}")
    return json.dumps(arguments, ensure_ascii=False)


def assemble_calls(deltas: list[ToolCallDelta]) -> list[ToolCall]:
    """What a client rebuilds from streamed deltas (how the OpenAI SDK accumulates them)."""
    calls: dict[int, ToolCall] = {}
    for delta in deltas:
        call = calls.setdefault(delta.index, ToolCall(id="", name="", arguments_json=""))
        call.id = delta.id or call.id
        call.name = delta.name or call.name
        call.arguments_json += delta.arguments_fragment
    return [calls[index] for index in sorted(calls)]
