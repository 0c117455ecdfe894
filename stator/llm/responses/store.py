"""A bounded in-memory store of finished responses, for `store` + `previous_response_id`.

A follow-up request continues from the conversation a stored response ended with: its input
messages plus its output turned back into chat messages. The oldest entries are evicted
first once `max_entries` is reached. Other backends implement the same two methods.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


class UnknownResponseError(KeyError):
    def __init__(self, response_id: str) -> None:
        super().__init__(response_id)
        self.response_id = response_id

    def __str__(self) -> str:
        return f"no stored response with id {self.response_id!r} (expired or never stored)"


class ResponseStore(Protocol):
    def put(self, response_id: str, messages: list[dict], response: dict) -> None: ...

    def get(self, response_id: str) -> tuple[list[dict], dict]: ...


class InMemoryResponseStore:
    def __init__(self, max_entries: int = 1024) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._max = max_entries
        self._entries: OrderedDict[str, tuple[list[dict], dict]] = OrderedDict()

    def put(self, response_id: str, messages: list[dict], response: dict) -> None:
        self._entries[response_id] = (messages, response)
        self._entries.move_to_end(response_id)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> tuple[list[dict], dict]:
        try:
            return self._entries[response_id]
        except KeyError:
            raise UnknownResponseError(response_id) from None

    def __len__(self) -> int:
        return len(self._entries)


def output_to_messages(response: dict) -> list[dict]:
    """A response's output items as chat messages (reasoning kept for the next turn)."""
    messages: list[dict] = []
    reasoning = ""
    for item in response.get("output", []):
        if item["type"] == "reasoning":
            reasoning += "".join(part.get("text", "") for part in item.get("content", []))
        elif item["type"] == "message":
            text = "".join(part.get("text", "") for part in item.get("content", []))
            message = {"role": "assistant", "content": text}
            if reasoning:
                message["reasoning"], reasoning = reasoning, ""
            messages.append(message)
        elif item["type"] == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and not reasoning:
                last.setdefault("tool_calls", []).append(call)
            else:
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning:
                    message["reasoning"], reasoning = reasoning, ""
                messages.append(message)
    return messages


def continue_conversation(
    store: ResponseStore, previous_response_id: str | None, new_messages: list[dict]
) -> list[dict]:
    """The full message list for a request: the stored conversation, then the new input."""
    if not previous_response_id:
        return new_messages
    messages, response = store.get(previous_response_id)
    return [*messages, *output_to_messages(response), *new_messages]
