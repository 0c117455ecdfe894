"""OpenAI Chat Completions messages → Harmony messages (for GPT-OSS prompts).

- `system` and `developer` messages become the developer message's instructions (the Harmony
  system message is ours: identity, dates, reasoning effort, channels).
- An assistant message's `reasoning` / `reasoning_content` becomes an `analysis` message, its
  `tool_calls` become `commentary` calls to `functions.NAME`, its `content` a `final` answer
  (or a `commentary` preamble when it also calls tools).
- A `tool` message becomes a message from `functions.NAME` to the assistant; NAME is found
  through `tool_call_id`.
"""

from __future__ import annotations

import json

from stator.parsers.harmony.render import DeveloperContent, HarmonyMessage, SystemContent


class ChatConversionError(ValueError):
    pass


def chat_to_harmony(
    messages: list[dict],
    *,
    tools: list[dict] | None = None,
    reasoning_effort: str | None = "medium",
    current_date: str | None = None,
    knowledge_cutoff: str | None = "2024-06",
) -> list[HarmonyMessage]:
    system = SystemContent(
        reasoning_effort=reasoning_effort,
        current_date=current_date,
        knowledge_cutoff=knowledge_cutoff,
    )
    out = [HarmonyMessage("system", system)]
    instructions = [
        _text(m.get("content")) for m in messages if m.get("role") in ("system", "developer")
    ]
    function_tools = [_function(tool) for tool in tools or []]
    if any(instructions) or function_tools:
        developer = DeveloperContent(
            "\n\n".join(i for i in instructions if i) or None, function_tools
        )
        out.append(HarmonyMessage("developer", developer))
    names_by_call_id: dict[str, str] = {}
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            continue
        if role == "user":
            out.append(HarmonyMessage("user", _text(message.get("content"))))
        elif role == "assistant":
            out += _assistant(message, names_by_call_id)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            name = message.get("name") or names_by_call_id.get(call_id or "")
            if not name:
                raise ChatConversionError(f"tool message answers unknown tool_call_id {call_id!r}")
            out.append(
                HarmonyMessage(
                    f"functions.{name}",
                    _text(message.get("content")),
                    channel="commentary",
                    recipient="assistant",
                )
            )
        else:
            raise ChatConversionError(f"unsupported message role {role!r}")
    return out


def _assistant(message: dict, names_by_call_id: dict[str, str]) -> list[HarmonyMessage]:
    out = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if reasoning:
        out.append(HarmonyMessage("assistant", reasoning, channel="analysis"))
    calls = message.get("tool_calls") or []
    content = _text(message.get("content"))
    if content:
        out.append(HarmonyMessage("assistant", content, channel="commentary" if calls else "final"))
    for call in calls:
        function = call.get("function") or {}
        name = function.get("name")
        if not name:
            raise ChatConversionError("assistant tool call without a function name")
        if call.get("id"):
            names_by_call_id[call["id"]] = name
        arguments = function.get("arguments") or "{}"
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        out.append(
            HarmonyMessage(
                "assistant",
                arguments,
                channel="commentary",
                recipient=f"functions.{name}",
                content_type="<|constrain|>json",
            )
        )
    return out


def _function(tool: dict) -> dict:
    if tool.get("type", "function") != "function":
        raise ChatConversionError(f"unsupported tool type {tool.get('type')!r}")
    function = tool.get("function", tool)
    if not function.get("name"):
        raise ChatConversionError("function tool without a name")
    return {
        "name": function["name"],
        "description": function.get("description") or "",
        "parameters": function.get("parameters"),
    }


def _text(content: object) -> str:
    """Message content: a string, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in (
                "text",
                "input_text",
                "output_text",
            ):
                raise ChatConversionError("only text content parts are supported for Harmony")
            parts.append(part.get("text", ""))
        return "".join(parts)
    raise ChatConversionError(f"unsupported content {type(content).__name__}")
