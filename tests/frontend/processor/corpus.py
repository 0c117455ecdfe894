"""The parity corpus: chat requests that stator's processor and vLLM's must render to the
same prompt ids, and recorded model outputs they must parse alike.

Requests are built from every combination of a few axes (who speaks first, how many
turns, tools and tool results, reasoning effort, odd text), so each axis is crossed with
the others; `chat_corpus()` gives them in a fixed order, each with a name for the test id.
"""

from __future__ import annotations

import itertools
from typing import Any

from tests.frontend.parser_stack import WEATHER_TOOL

WEATHER = WEATHER_TOOL
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a time zone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}

# Text that trips tokenizers and templates: accents, emoji with joiners and skin tones,
# right-to-left and combining marks, CJK, line and paragraph separators, a zero-width
# space, a byte-order mark, an escaped-looking brace and quote, control-ish whitespace.
ODD = {
    "ascii": "What is the weather like in Paris today?",
    "accents": "Ça va? Übermäßig schön, naïve façade, Ålesund.",
    "emoji": "Family: 👨‍👩‍👧‍👦, thumbs 👍🏽, flag 🇳🇴, keycap 1️⃣.",
    "rtl": "مرحبا بالعالم — שלום עולם (mixed RTL)",
    "combining": "e\u0301 a\u0308 Z\u0337\u0335\u0321a\u0334l\u0336g\u0337o\u0334",
    "cjk": "今日は良い天気ですね。你好，世界！안녕하세요",
    "separators": "line\u2028separator\u2029paragraph\u200bzero-width\ufeffbom",
    "markup": 'braces {{ not a template }} and "quotes" and <tags> & \\backslash',
    "whitespace": "  leading and trailing spaces \t tab\n\nblank line\r\ncrlf  ",
}
# A long message: about 40,000 characters (several thousand tokens).
LONG = " ".join(f"Sentence {i} about routing, caches and tokenizers." for i in range(800))

FIRST = {
    "none": [],
    "system": [{"role": "system", "content": "You are a terse assistant."}],
    "developer": [{"role": "developer", "content": "Answer in one line. Never apologise."}],
    "system+developer": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "developer", "content": "Answer in one line."},
    ],
}


def turns(text: str, shape: str) -> list[dict[str, Any]]:
    """The conversation after the first messages, for one shape."""
    if shape == "single":
        return [{"role": "user", "content": text}]
    if shape == "multi":
        return [
            {"role": "user", "content": "Hello!"},
            {"role": "assistant", "content": "Hi. What do you need?"},
            {"role": "user", "content": text},
        ]
    if shape == "parts":
        return [{"role": "user", "content": [{"type": "text", "text": text}]}]
    if shape == "tool_result":
        return [
            {"role": "user", "content": text},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "sky": "clear"}'},
        ]
    if shape == "tool_loop":
        return [
            *turns(text, "tool_result"),
            {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
            {"role": "user", "content": "And the time there?"},
        ]
    raise ValueError(shape)


SHAPES = ("single", "multi", "parts", "tool_result", "tool_loop")
TOOLSETS = {"none": None, "one": [WEATHER], "two": [WEATHER, TIME]}
EFFORTS = (None, "low", "medium", "high")


def chat_corpus() -> list[tuple[str, dict[str, Any]]]:
    """(name, request body without `model`) for every combination kept.

    Tool results only with tools offered (a conversation that called a tool had it);
    reasoning efforts crossed with the text kinds on single turns, and otherwise carried
    along round-robin so that every request does not repeat the default.
    """
    out: list[tuple[str, dict[str, Any]]] = []
    efforts = itertools.cycle(EFFORTS)
    texts = {**ODD, "long": LONG}
    for (first, head), shape, (tools_name, tools), (text_name, text) in itertools.product(
        FIRST.items(), SHAPES, TOOLSETS.items(), texts.items()
    ):
        if shape.startswith("tool") and tools is None:
            continue
        if text_name not in ("ascii", "emoji", "long", "whitespace") and (
            first not in ("none", "system") or tools_name == "two"
        ):
            continue  # odd text on the common heads; every head with the key texts
        body: dict[str, Any] = {"messages": [*head, *turns(text, shape)]}
        if tools is not None:
            body["tools"] = tools
        effort = next(efforts)
        if effort is not None:
            body["reasoning_effort"] = effort
        out.append((f"{first}-{shape}-tools_{tools_name}-{text_name}-{effort}", body))
    return out


# -- recorded outputs ------------------------------------------------------------------

# Hermes tool calls with Qwen3-style reasoning: (name, output text, tools offered).
ONE_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
UNICODE_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京 🗼"}}\n</tool_call>'
)
NESTED_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": '
    '"{\\"nested\\": [1, 2]}"}}\n</tool_call>'
)
TIME_CALL = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
HERMES_OUTPUTS = [
    ("plain", "Hello there, friend!", None),
    ("think_then_answer", "<think>I should greet them.</think>Hello there, friend!", None),
    ("think_unicode", "<think>Réfléchir… 🤔</think>Ответ: 42.", None),
    ("think_then_call", f"<think>Oslo's weather.</think>{ONE_CALL}", [WEATHER]),
    ("think_then_unicode_call", f"<think>東京.</think>{UNICODE_CALL}", [WEATHER]),
    ("think_then_nested_call", f"<think>Rome.</think>{NESTED_CALL}", [WEATHER]),
    ("think_preamble_call", f"<think>Weather.</think>Let me check.{ONE_CALL}", [WEATHER]),
    (
        "think_two_calls_adjacent",
        f"<think>Weather and time are needed.</think>{ONE_CALL}{TIME_CALL}",
        [WEATHER, TIME],
    ),
    ("think_no_call_with_tools", "<think>No tool fits.</think>I will not call.", [WEATHER]),
    ("no_call_with_tools", "I will not call anything.", [WEATHER]),
    # A call ends Qwen3's reasoning though no think block was opened or closed.
    ("call_without_think", ONE_CALL, [WEATHER]),
    ("unicode_call_without_think", UNICODE_CALL, [WEATHER]),
    ("nested_call_without_think", NESTED_CALL, [WEATHER]),
    ("preamble_call_without_think", f"Let me check.{ONE_CALL}", [WEATHER]),
    # Known to differ (docs/vllm.md, "Deliberate differences"; `HERMES_DIFFERENT`).
    ("think_blank_lines_then_call", f"<think>Rome.</think>\n\n{NESTED_CALL}", [WEATHER]),
    (
        "think_preamble_two_calls_newline",
        f"<think>Weather and time are needed.</think>Let me check.{ONE_CALL}\n{TIME_CALL}",
        [WEATHER, TIME],
    ),
]
# Outputs the two processors parse differently, and why (docs/vllm.md says more).
HERMES_DIFFERENT = {
    # Whitespace-only content next to Hermes calls: stator keeps it as content; vLLM
    # drops it (between calls always, before a call when not streaming).
    "think_preamble_two_calls_newline": "whitespace around calls",
    "think_blank_lines_then_call": "whitespace around calls",
}

# GPT-OSS Harmony outputs (text of Harmony tokens, as the model emits them after the
# prompt's `<|start|>assistant`): (name, output, tools offered).
HARMONY_OUTPUTS = [
    (
        "analysis_then_final",
        "<|channel|>analysis<|message|>The user greets me.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello there!<|return|>",
        None,
    ),
    ("final_only", "<|channel|>final<|message|>Just the answer: 42.<|return|>", None),
    (
        "tool_call",
        "<|channel|>analysis<|message|>Need the weather.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather "
        '<|constrain|>json<|message|>{"city": "Oslo"}<|call|>',
        [WEATHER],
    ),
    (
        "preamble_then_call",
        "<|channel|>commentary<|message|>Checking the time.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_time "
        '<|constrain|>json<|message|>{"tz": "CET"}<|call|>',
        [WEATHER, TIME],
    ),
    (
        "unicode_final",
        "<|channel|>analysis<|message|>Répondre en japonais.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>こんにちは 👋<|return|>",
        None,
    ),
]
