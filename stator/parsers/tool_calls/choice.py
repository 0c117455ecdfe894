"""`tool_choice` checks on a finished response: `none | auto | required | {function}`."""

from __future__ import annotations

from stator.parsers.tool_calls.base import ToolCall


class ToolChoiceError(ValueError):
    """The output does not honour the request's tool_choice (the frontend answers an error)."""


def tool_choice_function_name(tool_choice: str | dict | None) -> str | None:
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function") or {}
        name = function.get("name") or tool_choice.get("name")
        if not isinstance(name, str) or not name:
            raise ToolChoiceError("tool_choice object must name a function")
        return name
    return None


def parse_tools_enabled(tool_choice: str | dict | None) -> bool:
    """False for `none`: the output is plain content and no parser should run."""
    return tool_choice != "none"


def validate_tool_choice(
    tool_choice: str | dict | None, calls: list[ToolCall], tools: list[dict] | None = None
) -> None:
    """Raise ToolChoiceError if `calls` break the request's tool_choice."""
    if tool_choice in (None, "auto", "none"):
        if tool_choice == "none" and calls:
            raise ToolChoiceError("tool_choice is 'none' but the model called a tool")
        return
    if tool_choice == "required":
        if not calls:
            raise ToolChoiceError("tool_choice is 'required' but the model called no tool")
        known = {(t.get("function") or t).get("name") for t in tools or []}
        unknown = [c.name for c in calls if known and c.name not in known]
        if unknown:
            raise ToolChoiceError(f"the model called unknown tools: {', '.join(unknown)}")
        return
    name = tool_choice_function_name(tool_choice)
    if name is None:
        raise ToolChoiceError(f"unsupported tool_choice {tool_choice!r}")
    if not calls:
        raise ToolChoiceError(f"tool_choice requires a call of {name!r}; the model made none")
    wrong = [c.name for c in calls if c.name != name]
    if wrong:
        raise ToolChoiceError(f"tool_choice requires {name!r}; the model called {', '.join(wrong)}")
