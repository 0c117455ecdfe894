"""OpenAI Chat Completions messages → Harmony messages (for GPT-OSS prompts).

vLLM's own chat path for GPT-OSS is the reference (its prompt ids are what the model is
served with elsewhere), so the conversion follows it:
- The Harmony system message is ours: identity, knowledge cutoff, the conversation's
  start date (today, as vLLM), reasoning effort, channels.
- A leading `system` or `developer` message becomes the instructions of the developer
  message that also lists the tools; any later one becomes a developer message of its own,
  in place.
- User content given as text parts keeps its parts (each is encoded on its own).
- An assistant message's `tool_calls` become `commentary` calls to `functions.NAME` (content
  type `json`), preceded by its `content` as a `commentary` preamble and then its
  `reasoning` / `reasoning_content` as `analysis`; without calls, the reasoning is
  `analysis` and the content the `final` answer.
- A `tool` message becomes a message from `functions.NAME` to the assistant; NAME is found
  through `tool_call_id` (or the message's `name`).
"""

from __future__ import annotations

import datetime
import json

from stator.parsers.harmony.render import DeveloperContent, HarmonyMessage, SystemContent


class ChatConversionError(ValueError):
    pass


def conversation_start_date() -> str:
    """Today's date, in local time, as vLLM puts it in the system message."""
    return datetime.datetime.now().strftime("%Y-%m-%d")


def chat_to_harmony(
    messages: list[dict],
    *,
    tools: list[dict] | None = None,
    reasoning_effort: str | None = "medium",
    current_date: str | None = None,
    knowledge_cutoff: str | None = "2024-06",
) -> list[HarmonyMessage]:
    """`current_date` None means today (`conversation_start_date`)."""
    system = SystemContent(
        reasoning_effort=reasoning_effort,
        current_date=current_date or conversation_start_date(),
        knowledge_cutoff=knowledge_cutoff,
    )
    out = [HarmonyMessage("system", system)]
    instructions = None
    if messages and messages[0].get("role") in ("system", "developer"):
        instructions = _text(messages[0].get("content")) or None
        messages = messages[1:]
    function_tools = [_function(tool) for tool in tools or []]
    if instructions or function_tools:
        out.append(HarmonyMessage("developer", DeveloperContent(instructions, function_tools)))
    names_by_call_id = {
        call["id"]: (call.get("function") or {}).get("name")
        for message in messages
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or []
        if isinstance(call, dict) and call.get("id")
    }
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            if message.get("content") is not None:
                developer = DeveloperContent(_text(message.get("content")))
                out.append(HarmonyMessage("developer", developer))
        elif role == "user":
            out.append(HarmonyMessage("user", _parts(message.get("content"))))
        elif role == "assistant":
            out += _assistant(message)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            name = names_by_call_id.get(call_id or "") or message.get("name")
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


def _assistant(message: dict) -> list[HarmonyMessage]:
    reasoning = _text(message.get("reasoning") or message.get("reasoning_content"))
    analysis = [HarmonyMessage("assistant", reasoning, channel="analysis")] if reasoning else []
    content = _text(message.get("content"))
    calls = message.get("tool_calls") or []
    if not calls:
        answer = _parts(message.get("content"))
        final = [HarmonyMessage("assistant", answer, channel="final")] if content else []
        return analysis + final
    out = [HarmonyMessage("assistant", content, channel="commentary")] if content else []
    out += analysis
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("function") or {}, dict):
            raise ChatConversionError("each tool call must be an object with a function object")
        function = call.get("function") or {}
        name = function.get("name")
        if not name:
            raise ChatConversionError("assistant tool call without a function name")
        arguments = function.get("arguments") or ""
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        out.append(
            HarmonyMessage(
                "assistant",
                arguments,
                channel="commentary",
                recipient=f"functions.{name}",
                content_type="json",
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


def _parts(content: object) -> str | list[str]:
    """User and answer content: a list of text parts stays a list (vLLM encodes each part
    on its own, and "a " + "b" may not tokenize as "a b")."""
    if isinstance(content, list):
        return [_text([part]) for part in content]
    return _text(content)


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
