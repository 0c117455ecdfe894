"""Structured output: a request's `GuidedDecoding` spec as a grammar, and per-request
matchers that say which tokens may come next.

The grammar library is llguidance (chosen over xgrammar by measured mask time per token
on 128k and 200k vocabularies: `benchmarks/grammar_mask.py`, results in
`benchmarks/README.md`). `grammar.py` turns a spec into llguidance's grammar text and
validates it without a tokenizer (the frontend's 400s); `matcher.py` binds grammars to a
model's vocabulary, caches compiled grammars per spec, and fills token bitmasks;
`tools.py` turns a forced `tool_choice` into a JSON schema.
"""

from stator.structured_output.grammar import (
    InvalidGrammar,
    available,
    grammar_text,
    spec_key,
    validate,
)
from stator.structured_output.tools import forced_tool_schema, parse_forced_calls

__all__ = [
    "InvalidGrammar",
    "available",
    "forced_tool_schema",
    "grammar_text",
    "parse_forced_calls",
    "spec_key",
    "validate",
]
