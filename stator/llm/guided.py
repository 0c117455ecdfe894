"""Structured-output requests (`response_format`, vLLM's `guided_*` and
`structured_outputs`) to one `GuidedDecoding` spec for the engine."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from stator.llm.validate import InvalidParam
from stator.protocols import GuidedDecoding
from stator.structured_output import InvalidGrammar, validate

_GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
# vLLM's newer `structured_outputs: {json|regex|choice|grammar: ...}` spelling.
_STRUCTURED_KEYS = {
    "json": "guided_json",
    "regex": "guided_regex",
    "choice": "guided_choice",
    "grammar": "guided_grammar",
}


def guided_decoding(body: Mapping[str, Any]) -> GuidedDecoding | None:
    """The request's one structured-output constraint, or None. Raises `InvalidParam`."""
    specs: list[tuple[str, GuidedDecoding]] = []
    fmt = body.get("response_format")
    if fmt is not None:
        spec = _response_format(fmt)
        if spec is not None:
            specs.append(("response_format", spec))
    for field in _GUIDED_FIELDS:
        if body.get(field) is not None:
            specs.append((field, _guided_field(field, body[field])))
    structured = body.get("structured_outputs")
    if structured is not None:
        if not isinstance(structured, Mapping):
            raise InvalidParam("structured_outputs must be an object.", "structured_outputs")
        for key, field in _STRUCTURED_KEYS.items():
            if structured.get(key) is not None:
                specs.append(("structured_outputs", _guided_field(field, structured[key])))
    if len(specs) > 1:
        names = ", ".join(name for name, _ in specs)
        raise InvalidParam(
            f"Only one structured-output constraint may be given; got {names}.", specs[1][0]
        )
    if not specs:
        return None
    param, spec = specs[0]
    pattern = body.get("guided_whitespace_pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise InvalidParam(
                "guided_whitespace_pattern must be a string.", "guided_whitespace_pattern"
            )
        spec.whitespace_pattern = pattern
    try:
        validate(spec, param)
    except InvalidGrammar as exc:
        raise InvalidParam(exc.message, exc.param) from None
    return spec


def _response_format(fmt: Any) -> GuidedDecoding | None:
    param = "response_format"
    if not isinstance(fmt, Mapping):
        raise InvalidParam("response_format must be an object.", param)
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GuidedDecoding(json_object=True)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, Mapping):
            raise InvalidParam(
                "response_format.json_schema must be an object with a 'schema'.", param
            )
        # OpenAI nests the schema under `schema`; some clients send it as `json_schema`.
        schema = spec.get("schema", spec.get("json_schema"))
        if schema is None:
            schema = {}  # OpenAI allows a name without a schema: any JSON object
        return GuidedDecoding(json_schema=_schema(schema, param))
    raise InvalidParam(
        f"response_format.type must be 'text', 'json_object' or 'json_schema'; got {kind!r}.",
        param,
    )


def _guided_field(field: str, value: Any) -> GuidedDecoding:
    if field == "guided_json":
        return GuidedDecoding(json_schema=_schema(value, field))
    if field == "guided_choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise InvalidParam(f"{field} must be a non-empty list of strings.", field)
        return GuidedDecoding(choice=list(value))
    if not isinstance(value, str) or not value:
        raise InvalidParam(f"{field} must be a non-empty string.", field)
    if field == "guided_regex":
        return GuidedDecoding(regex=value)
    return GuidedDecoding(grammar=value)


def _schema(value: Any, param: str) -> dict[str, Any]:
    """A JSON schema, sent either parsed or as a JSON string."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise InvalidParam(f"{param}: the schema is not valid JSON: {e}", param) from None
    if not isinstance(value, Mapping):
        raise InvalidParam(f"{param}: the schema must be a JSON object.", param)
    return dict(value)
