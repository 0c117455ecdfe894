"""Function tools as the TypeScript-like declarations GPT-OSS was trained on.

The layout (indentation, where comments go, `?` for optional fields, how defaults print)
follows the Harmony reference renderer, so that prompts match token for token.
"""

from __future__ import annotations

import json
from typing import Any


def tools_namespace(namespace: str, tools: list[dict], description: str | None = None) -> str:
    """`## functions` section: `tools` are {name, description, parameters} dicts."""
    lines = [f"## {namespace}\n"]
    if description:
        for line in description.splitlines():
            lines.append(f"// {line}" if tools else line)
    if tools:
        lines.append(f"namespace {namespace} {{\n")
        for tool in tools:
            for line in (tool.get("description") or "").splitlines():
                lines.append(f"// {line}")
            parameters = tool.get("parameters")
            if parameters:
                lines.append(
                    f"type {tool['name']} = (_: {schema_to_typescript(parameters)}) => any;\n"
                )
            else:
                lines.append(f"type {tool['name']} = () => any;\n")
        lines.append(f"}} // namespace {namespace}")
    return "\n".join(lines)


def schema_to_typescript(schema: dict[str, Any], indent: str = "") -> str:
    if isinstance(schema.get("oneOf"), list):
        return "".join(
            f"\n{indent} | {_variant(variant, indent + '   ', skip_description=False)}"
            for variant in schema["oneOf"]
        )
    kind = schema.get("type")
    if isinstance(kind, list):
        names = ["number" if k == "integer" else k for k in kind if isinstance(k, str)]
        if names:
            return " | ".join(names)
    if kind == "object":
        return _object(schema, indent)
    if kind == "string":
        values = [f'"{v}"' for v in schema.get("enum") or [] if isinstance(v, str)]
        return " | ".join(values) if values else "string"
    if kind in ("number", "integer"):
        return "number"
    if kind == "boolean":
        return "boolean"
    if kind == "array":
        items = schema.get("items")
        return f"{schema_to_typescript(items, indent)}[]" if items else "Array<any>"
    return "any"


def _object(schema: dict, indent: str) -> str:
    out = (
        f"{indent}// {schema['description']}\n"
        if isinstance(schema.get("description"), str)
        else ""
    )
    out += "{\n"
    required = set(schema.get("required") or [])
    for key, prop in (schema.get("properties") or {}).items():
        optional = "" if key in required else "?"
        if isinstance(prop.get("title"), str):
            out += f"{indent}// {prop['title']}\n{indent}//\n"
        one_of = prop.get("oneOf")
        if not isinstance(one_of, list) and isinstance(prop.get("description"), str):
            out += f"{indent}// {prop['description']}\n"
        examples = prop.get("examples")
        if isinstance(examples, list) and examples:
            out += f"{indent}// Examples:\n"
            out += "".join(f'{indent}// - "{e}"\n' for e in examples if isinstance(e, str))
        if isinstance(one_of, list):
            out += _one_of_property(key, optional, prop, one_of, indent)
            continue
        out += f"{indent}{key}{optional}: {_nullable(prop, schema_to_typescript(prop, indent + '    '))},"
        if "default" in prop:
            out += f" // default: {_default(prop)}"
        out += "\n"
    return out + f"{indent}}}"


def _one_of_property(key: str, optional: str, prop: dict, one_of: list, indent: str) -> str:
    description = prop.get("description") if isinstance(prop.get("description"), str) else None
    first_description = one_of[0].get("description") if one_of else None
    out, described_above = "", False
    if description is not None and description != first_description:
        out += f"{indent}// {description}\n"
        described_above = True
    if "default" in prop:
        out += f"{indent}// default: {_default(prop)}\n"
    out += f"{indent}{key}{optional}:\n"
    for i, variant in enumerate(one_of):
        comments = []
        variant_description = variant.get("description")
        skip = i == 0 and described_above
        if not skip and isinstance(variant_description, str) and variant_description != description:
            comments.append(variant_description)
        if "default" in variant:
            comments.append(f"default: {_default(variant)}")
        out += f"{indent} | {_nullable(variant, schema_to_typescript(variant, indent + '   '))}"
        out += f" // {' '.join(comments)}" if comments else ""
        out += "\n"
    return out + f"{indent},\n"


def _variant(variant: dict, indent: str, *, skip_description: bool) -> str:
    text = _nullable(variant, schema_to_typescript(variant, indent))
    comments = []
    if not skip_description and isinstance(variant.get("description"), str):
        comments.append(variant["description"])
    if "default" in variant:
        comments.append(f"default: {_default(variant)}")
    return text + (f" // {' '.join(comments)}" if comments else "")


def _nullable(schema: dict, text: str) -> str:
    return f"{text} | null" if schema.get("nullable") is True and "null" not in text else text


def _default(schema: dict) -> str:
    value = schema["default"]
    if isinstance(value, str):
        # Enum defaults print bare, other strings quoted (as the reference does).
        return value if schema.get("enum") else f'"{value}"'
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
