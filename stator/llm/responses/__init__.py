"""The Responses API as pure translation: request input → chat messages, parsed output →
the documented event stream and response object, and a store for `previous_response_id`.
No HTTP here; the frontend's route wires these to a model's pipeline."""

from stator.llm.responses.events import ResponseBuilder, ResponseUsage, output_text
from stator.llm.responses.input import (
    ResponsesInputError,
    input_to_messages,
    tool_choice_to_chat,
    tools_to_chat,
)
from stator.llm.responses.store import (
    InMemoryResponseStore,
    ResponseStore,
    UnknownResponseError,
    continue_conversation,
    output_to_messages,
)

__all__ = [
    "InMemoryResponseStore",
    "ResponseBuilder",
    "ResponseStore",
    "ResponseUsage",
    "ResponsesInputError",
    "UnknownResponseError",
    "continue_conversation",
    "input_to_messages",
    "output_text",
    "output_to_messages",
    "tool_choice_to_chat",
    "tools_to_chat",
]
