"""`GuidedDecoding` -> llguidance grammar text, and validation without a tokenizer."""

from __future__ import annotations

import functools
import json
from typing import Any

from stator.protocols import GuidedDecoding

# Characters that are special somewhere in a regex (Rust `regex` syntax, which llguidance
# uses): escaped when a `choice` literal becomes an alternation.
_REGEX_SPECIAL = set("\\.+*?()|[]{}^$#&-~")


class InvalidGrammar(ValueError):
    """A spec that cannot be compiled; `param` names the request field it came from."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@functools.cache
def available() -> bool:
    """Whether the grammar library is installed."""
    try:
        import llguidance  # noqa: F401
    except ImportError:
        return False
    return True


def spec_param(spec: GuidedDecoding) -> str:
    """The vLLM field a spec would have come in (for error messages)."""
    if spec.json_schema is not None:
        return "guided_json"
    if spec.json_object:
        return "response_format"
    if spec.regex is not None:
        return "guided_regex"
    if spec.choice is not None:
        return "guided_choice"
    return "guided_grammar"


def spec_key(spec: GuidedDecoding) -> str:
    """A stable key of the constraint (the compiled-grammar cache's key)."""
    return json.dumps(
        [
            spec.json_schema,
            spec.json_object,
            spec.regex,
            spec.choice,
            spec.grammar,
            spec.whitespace_pattern,
        ],
        sort_keys=True,
        separators=(",", ":"),
    )


def grammar_text(spec: GuidedDecoding, param: str | None = None) -> str:
    """llguidance's grammar for `spec`. Raises `InvalidGrammar` for a spec that sets no
    constraint or one it cannot even translate (the library validates the rest)."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

    param = param or spec_param(spec)
    if spec.json_schema is not None or spec.json_object:
        schema: dict[str, Any] = (
            spec.json_schema if spec.json_schema is not None else {"type": "object"}
        )
        options: dict[str, Any] = {}
        if spec.whitespace_pattern is not None:
            options["whitespace_pattern"] = spec.whitespace_pattern
        else:
            # Compact JSON: a model under constraint otherwise may pad with whitespace
            # until max_tokens (a well-known failure of flexible whitespace).
            options["whitespace_flexible"] = False
            options["item_separator"] = ", "
            options["key_separator"] = ": "
        try:
            return LLMatcher.grammar_from_json_schema(schema, overrides=options)
        except (ValueError, TypeError) as exc:
            raise InvalidGrammar(f"{param}: invalid JSON schema: {exc}", param) from None
    if spec.regex is not None:
        return LLMatcher.grammar_from_regex(spec.regex)
    if spec.choice is not None:
        if not spec.choice:
            raise InvalidGrammar(f"{param} must list at least one choice.", param)
        return LLMatcher.grammar_from_regex("|".join(_escape(c) for c in spec.choice))
    if spec.grammar is not None:
        try:
            # GBNF / EBNF (`root ::= ...`, as vLLM's xgrammar takes) or Lark (`start: ...`).
            return LLMatcher.grammar_from_lark(any_to_lark(spec.grammar))
        except GbnfToLarkError as exc:
            raise InvalidGrammar(f"{param}: invalid grammar: {exc}", param) from None
    raise InvalidGrammar("the structured-output constraint sets nothing", param)


def validate(spec: GuidedDecoding, param: str | None = None) -> None:
    """Raise `InvalidGrammar` (naming `param`, or the spec's own field) when the library
    rejects the constraint. A no-op without the library: the worker then decides."""
    if not available():
        return
    text = grammar_text(spec, param)
    is_error, messages = _check(text)
    if is_error:
        name = param or spec_param(spec)
        detail = messages[0].strip() if messages else "invalid"
        raise InvalidGrammar(f"{name}: the constraint cannot be compiled: {detail}", name)


@functools.lru_cache(maxsize=512)
def _check(text: str) -> tuple[bool, list[str]]:
    from llguidance import LLMatcher

    return LLMatcher.validate_grammar_with_warnings(text)


def _escape(literal: str) -> str:
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in literal)
