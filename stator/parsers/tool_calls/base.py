"""The tool-call parser interface and the registry that picks one by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from stator.parsers.calls import (
    ToolCall,
    ToolCallDelta,
    ToolDelta,
    assemble_calls,
    new_call_id,
    normalize_arguments,
)

__all__ = [
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolDelta",
    "assemble_calls",
    "get_tool_call_parser",
    "new_call_id",
    "normalize_arguments",
    "register_tool_call_parser",
    "tool_call_parser_names",
]


class ToolCallParser(Protocol):
    def feed(self, text_delta: str) -> ToolDelta: ...

    def finish(self) -> ToolDelta: ...

    def parse(self, text: str) -> tuple[str, list[ToolCall]]: ...


_REGISTRY: dict[str, Callable[..., ToolCallParser]] = {}


def register_tool_call_parser(name: str):
    def wrap(factory: Callable[..., ToolCallParser]) -> Callable[..., ToolCallParser]:
        _REGISTRY[name] = factory
        return factory

    return wrap


def tool_call_parser_names() -> list[str]:
    return sorted(_REGISTRY)


def get_tool_call_parser(
    name: str, tools: list[dict] | None = None, *, id_factory: Callable[[], str] = new_call_id
) -> ToolCallParser:
    """A fresh parser for one response. `tools` are the request's OpenAI tool definitions
    (some formats need their schemas to type arguments)."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown tool-call parser {name!r}; known: {', '.join(tool_call_parser_names())}"
        ) from None
    return factory(tools=tools or [], id_factory=id_factory)
