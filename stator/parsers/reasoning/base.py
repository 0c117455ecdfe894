"""What every reasoning parser returns, and the registry that picks one by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class ReasoningDelta:
    """Text split from one delta: the model's reasoning and the user-visible content."""

    reasoning: str = ""
    content: str = ""

    def __add__(self, other: ReasoningDelta) -> ReasoningDelta:
        return ReasoningDelta(self.reasoning + other.reasoning, self.content + other.content)


class ReasoningParser(Protocol):
    def feed(self, text_delta: str) -> ReasoningDelta: ...

    def finish(self) -> ReasoningDelta: ...


_REGISTRY: dict[str, Callable[..., ReasoningParser]] = {}


def register_reasoning_parser(name: str):
    def wrap(factory: Callable[..., ReasoningParser]) -> Callable[..., ReasoningParser]:
        _REGISTRY[name] = factory
        return factory

    return wrap


def reasoning_parser_names() -> list[str]:
    return sorted(_REGISTRY)


def get_reasoning_parser(name: str, **options: Any) -> ReasoningParser:
    """A fresh parser for one response; `options` are per-request (e.g. `enable_thinking`)."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown reasoning parser {name!r}; known: {', '.join(reasoning_parser_names())}"
        ) from None
    return factory(**options)


def parse_reasoning(parser: ReasoningParser, text: str) -> ReasoningDelta:
    """Non-streaming use: the whole output at once."""
    return parser.feed(text) + parser.finish()
