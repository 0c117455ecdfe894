"""Responses API request → Chat Completions shapes (messages, tools, tool_choice).

`input` is a string (one user message) or a list of items: messages (`{"role", "content"}`,
with or without `"type": "message"`), `function_call`, `function_call_output` and `reasoning`
items. `instructions` becomes a leading system message. Reasoning items attach to the next
assistant turn (so GPT-OSS keeps its chain of thought across tool calls).
"""

from __future__ import annotations

from typing import Any

_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesInputError(ValueError):
    """Bad request input; `param` names the offending field (for the OpenAI error object)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def input_to_messages(input_: str | list | None, instructions: str | None = None) -> list[dict]:
    messages: list[dict] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if input_ is None:
        raise ResponsesInputError("'input' is required", "input")
    if isinstance(input_, str):
        messages.append({"role": "user", "content": input_})
        return messages
    if not isinstance(input_, list):
        raise ResponsesInputError("'input' must be a string or a list of items", "input")
    pending_reasoning = ""
    for index, item in enumerate(input_):
        param = f"input[{index}]"
        if not isinstance(item, dict):
            raise ResponsesInputError("each input item must be an object", param)
        kind = item.get("type", "message")
        if kind == "message":
            message = _message(item, param)
            if message["role"] == "assistant" and pending_reasoning:
                message["reasoning"], pending_reasoning = pending_reasoning, ""
            messages.append(message)
        elif kind == "function_call":
            call = _function_call(item, param)
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and not pending_reasoning:
                last.setdefault("tool_calls", []).append(call)
            else:
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                if pending_reasoning:
                    message["reasoning"], pending_reasoning = pending_reasoning, ""
                messages.append(message)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ResponsesInputError("function_call_output needs a 'call_id'", param)
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _output_text(item, param)}
            )
        elif kind == "reasoning":
            pending_reasoning += _reasoning_text(item)
        else:
            raise ResponsesInputError(f"unsupported input item type {kind!r}", f"{param}.type")
    return messages


def tools_to_chat(tools: list | None) -> list[dict]:
    """Responses function tools are flat (`{"type": "function", "name", "parameters"}`)."""
    out = []
    for index, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise ResponsesInputError(
                f"only function tools are supported, got {kind!r}", f"tools[{index}].type"
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise ResponsesInputError("function tool needs a 'name'", f"tools[{index}].name")
        function = {"name": tool["name"], "parameters": tool.get("parameters") or {}}
        if tool.get("description"):
            function["description"] = tool["description"]
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out


def tool_choice_to_chat(tool_choice: Any) -> str | dict | None:
    if tool_choice is None or tool_choice in ("auto", "none", "required"):
        return tool_choice
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = tool_choice.get("name")
        if isinstance(name, str) and name:
            return {"type": "function", "function": {"name": name}}
    raise ResponsesInputError(
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
        "tool_choice",
    )


def _message(item: dict, param: str) -> dict:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise ResponsesInputError(f"unsupported message role {role!r}", f"{param}.role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise ResponsesInputError("message content must be a string or a list", f"{param}.content")
    texts = []
    for part_index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
            kind = part.get("type") if isinstance(part, dict) else None
            raise ResponsesInputError(
                f"unsupported content part {kind!r}", f"{param}.content[{part_index}]"
            )
        texts.append(str(part.get("text", "")))
    return {"role": role, "content": "".join(texts)}


def _function_call(item: dict, param: str) -> dict:
    name, call_id = item.get("name"), item.get("call_id")
    if not isinstance(name, str) or not name:
        raise ResponsesInputError("function_call needs a 'name'", f"{param}.name")
    if not isinstance(call_id, str) or not call_id:
        raise ResponsesInputError("function_call needs a 'call_id'", f"{param}.call_id")
    arguments = item.get("arguments", "{}")
    if not isinstance(arguments, str):
        raise ResponsesInputError(
            "function_call 'arguments' must be a string", f"{param}.arguments"
        )
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _output_text(item: dict, param: str) -> str:
    output = item.get("output")
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(
            str(part.get("text", ""))
            for part in output
            if isinstance(part, dict) and part.get("type") in _TEXT_PARTS
        )
    raise ResponsesInputError("function_call_output needs an 'output' string", f"{param}.output")


def _reasoning_text(item: dict) -> str:
    parts = item.get("content") or item.get("summary") or []
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
