"""Our Harmony renderer and parser agree with `openai-harmony`, token for token."""

from __future__ import annotations

import json

import pytest

from stator.parsers.calls import assemble_calls
from stator.parsers.harmony import (
    DeveloperContent,
    HarmonyMessage,
    HarmonyRenderer,
    HarmonyStreamParser,
    HarmonyTokenIds,
    SystemContent,
    chat_to_harmony,
)

WEATHER = {
    "name": "get_weather",
    "description": "Gets the current weather.\nUse for any city.",
    "parameters": {
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "City and state, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            "days": {"type": "integer", "default": 1},
            "tags": {"type": "array", "items": {"type": "string"}},
            "filters": {
                "type": "object",
                "description": "Optional filters",
                "properties": {"min": {"type": "number"}, "max": {"type": ["number", "null"]}},
                "required": ["min"],
            },
            "mode": {
                "description": "How to look it up",
                "oneOf": [{"type": "string"}, {"type": "integer", "description": "a code"}],
            },
            "label": {"type": "string", "title": "Label", "examples": ["home", "work"]},
            "note": {"type": "string", "nullable": True, "default": "none"},
        },
        "required": ["location"],
    },
}
PING = {"name": "ping", "description": "Checks the service."}


def to_reference(message: HarmonyMessage):
    import openai_harmony as h

    content = message.content
    if isinstance(content, SystemContent):
        system = h.SystemContent.new().with_reasoning_effort(
            h.ReasoningEffort(content.reasoning_effort.capitalize())
        )
        if content.current_date:
            system = system.with_conversation_start_date(content.current_date)
        ref = h.Message.from_role_and_content(h.Role.SYSTEM, system)
    elif isinstance(content, DeveloperContent):
        developer = h.DeveloperContent.new()
        if content.instructions:
            developer = developer.with_instructions(content.instructions)
        if content.function_tools:
            developer = developer.with_function_tools(
                [
                    h.ToolDescription.new(
                        t["name"], t["description"], parameters=t.get("parameters")
                    )
                    for t in content.function_tools
                ]
            )
        ref = h.Message.from_role_and_content(h.Role.DEVELOPER, developer)
    elif message.author in ("user", "assistant"):
        ref = h.Message.from_role_and_content(h.Role(message.author), content)
    else:
        ref = h.Message.from_author_and_content(h.Author.new(h.Role.TOOL, message.author), content)
    if message.author != "assistant" and message.recipient:
        # Deliberate difference: we put a tool result's recipient after its channel, as
        # vLLM does (render.py); openai-harmony 0.0.8 puts it before. Folded into the
        # channel text, the reference renders the same tokens as we do.
        ref = ref.with_channel(f"{message.channel} to={message.recipient}")
    elif message.channel:
        ref = ref.with_channel(message.channel)
    if message.recipient and message.author == "assistant":
        ref = ref.with_recipient(message.recipient)
    if message.content_type:
        ref = ref.with_content_type(message.content_type)
    return ref


def reference_prompt(encoding, messages: list[HarmonyMessage]) -> list[int]:
    import openai_harmony as h

    conversation = h.Conversation.from_messages([to_reference(m) for m in messages])
    return encoding.render_conversation_for_completion(conversation, h.Role.ASSISTANT)


def sys_msg(**kw) -> HarmonyMessage:
    return HarmonyMessage("system", SystemContent(**kw))


def dev_msg(instructions=None, tools=()) -> HarmonyMessage:
    return HarmonyMessage("developer", DeveloperContent(instructions, list(tools)))


def call(name: str, arguments: str) -> HarmonyMessage:
    return HarmonyMessage(
        "assistant", arguments, "commentary", f"functions.{name}", "<|constrain|>json"
    )


def result(name: str, text: str) -> HarmonyMessage:
    return HarmonyMessage(f"functions.{name}", text, "commentary", "assistant")


def analysis(text: str) -> HarmonyMessage:
    return HarmonyMessage("assistant", text, "analysis")


def final(text: str) -> HarmonyMessage:
    return HarmonyMessage("assistant", text, "final")


CONVERSATIONS = {
    "tools_and_instructions": [
        sys_msg(reasoning_effort="high", current_date="2025-06-28"),
        dev_msg("Answer in riddles.", [WEATHER, PING]),
        HarmonyMessage("user", "What is the weather in Tokyo?"),
    ],
    "no_tools_low_effort": [
        sys_msg(reasoning_effort="low"),
        dev_msg("Be brief."),
        HarmonyMessage("user", "Hi"),
    ],
    "tool_loop_keeps_analysis": [
        sys_msg(),
        dev_msg(None, [WEATHER]),
        HarmonyMessage("user", "Weather in Tokyo and Paris?"),
        analysis("I need both cities."),
        call("get_weather", '{"location":"Tokyo"}'),
        result("get_weather", '{"temp": 20}'),
        analysis("Now Paris."),
        HarmonyMessage("assistant", "Checking Paris next.", "commentary"),
        call("get_weather", '{"location":"Paris"}'),
        result("get_weather", '{"temp": 18}'),
    ],
    "finished_turn_drops_analysis": [
        sys_msg(current_date="2025-01-01"),
        dev_msg(None, [PING]),
        HarmonyMessage("user", "Is it up?"),
        analysis("Call ping."),
        call("ping", "{}"),
        result("ping", "ok"),
        analysis("It answered."),
        final("Yes, it is up."),
        HarmonyMessage("user", "Thanks! And now?"),
    ],
    "control_text_and_unicode_in_content": [
        sys_msg(),
        HarmonyMessage("user", "Type <|end|> and <|call|> literally; 東京は☀️? ünïcödé"),
        analysis("They typed <|start|> too."),
        final("Sure: <|end|> — 晴れ."),
        HarmonyMessage("user", "again"),
    ],
}


@pytest.fixture(scope="module")
def renderer(harmony_tokenizer):
    return HarmonyRenderer(harmony_tokenizer)


def test_tokenizer_matches_reference_encoding(harmony_tokenizer, reference_encoding):
    for text in ["hello world", "東京は☀️", "  spaced\n\n\tout  ", "def f(x):\n    return x**2"]:
        ours = harmony_tokenizer.encode(text, add_special_tokens=False).ids
        assert ours == reference_encoding.encode(text)


def test_stop_tokens_match_reference(harmony_tokenizer, reference_encoding):
    ids = HarmonyTokenIds.from_tokenizer(harmony_tokenizer)
    assert set(ids.stop_token_ids) == set(reference_encoding.stop_tokens_for_assistant_actions())


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_render_matches_reference(name, renderer, reference_encoding):
    messages = CONVERSATIONS[name]
    assert renderer.render_for_completion(messages) == reference_prompt(
        reference_encoding, messages
    )


def test_analysis_of_every_finished_turn_is_dropped(renderer, reference_encoding):
    """Deliberate difference: the spec drops CoT of all finished turns; openai-harmony 0.0.8
    drops only analysis before the *first* final. We differ exactly by the older analysis."""
    messages = [
        sys_msg(),
        HarmonyMessage("user", "q1"),
        analysis("think1"),
        final("a1"),
        HarmonyMessage("user", "q2"),
        analysis("think2"),
        final("a2"),
        HarmonyMessage("user", "q3"),
    ]
    ours = renderer.render_for_completion(messages)
    without_think2 = [m for m in messages if m.content != "think2"]
    assert ours == reference_prompt(reference_encoding, without_think2)


def test_chat_conversion_renders_like_reference(renderer, reference_encoding):
    chat = [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "reasoning_content": "Use the tool.",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"location":"Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": -3}'},
    ]
    messages = chat_to_harmony(
        chat, tools=[{"type": "function", "function": WEATHER}], current_date="2025-03-04"
    )
    expected = [
        sys_msg(current_date="2025-03-04"),
        dev_msg("Be helpful.", [WEATHER]),
        HarmonyMessage("user", "Weather in Oslo?"),
        analysis("Use the tool."),
        # vLLM's content type for a call in the history (not `<|constrain|>json`).
        HarmonyMessage(
            "assistant", '{"location":"Oslo"}', "commentary", "functions.get_weather", "json"
        ),
        result("get_weather", '{"temp": -3}'),
    ]
    assert renderer.render_for_completion(messages) == reference_prompt(
        reference_encoding, expected
    )


# -- parsing ---------------------------------------------------------------------------

COMPLETIONS = {
    "analysis_then_final": [analysis("Let me think… 2+2=4."), final("It is **4**. 🎉")],
    "tool_call": [analysis("Need weather."), call("get_weather", '{"location":"東京"}')],
    "preamble_and_two_calls": [
        analysis("Two lookups."),
        HarmonyMessage("assistant", "Looking both up.", "commentary"),
        call("get_weather", '{"location":"Rome"}'),
    ],
    "final_only": [final("Just the answer, with <|end|> typed as text.")],
}


def completion_tokens(
    encoding, messages: list[HarmonyMessage], *, end_with_return: bool
) -> list[int]:
    """What the model generates after the prompt's `<|start|>assistant`."""
    tokens: list[int] = []
    for message in messages:
        tokens += encoding.render(to_reference(message))
    tokens = tokens[2:]  # <|start|> and "assistant" are in the prompt
    if end_with_return and tokens[-1] == 200007:
        tokens[-1] = 200002
    return tokens


def expected_from_reference(encoding, tokens: list[int]):
    import openai_harmony as h

    parsed = encoding.parse_messages_from_completion_tokens(tokens, h.Role.ASSISTANT)
    reasoning = content = ""
    calls = []
    for message in parsed:
        text = "".join(part.text for part in message.content)
        if message.recipient and message.recipient.startswith("functions."):
            calls.append((message.recipient.removeprefix("functions."), text))
        elif message.channel == "analysis":
            reasoning += text
        else:
            content += text
    return reasoning, content, calls


@pytest.mark.parametrize("name", sorted(COMPLETIONS))
@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_parse_matches_reference(name, chunk, harmony_tokenizer, reference_encoding):
    tokens = completion_tokens(reference_encoding, COMPLETIONS[name], end_with_return=True)
    parser = HarmonyStreamParser(harmony_tokenizer)
    deltas = [parser.feed(tokens[i : i + chunk]) for i in range(0, len(tokens), chunk)]
    deltas.append(parser.finish())
    reasoning = "".join(d.reasoning for d in deltas)
    content = "".join(d.content for d in deltas)
    calls = [
        (c.name, c.arguments_json) for c in assemble_calls([c for d in deltas for c in d.calls])
    ]
    assert (reasoning, content, calls) == expected_from_reference(reference_encoding, tokens)
    for marker in ("<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|start|>", "<|return|>"):
        assert marker not in reasoning
    assert "<|call|>" not in content and "<|channel|>" not in content


def test_streamed_deltas_match_reference_streamable_parser(harmony_tokenizer, reference_encoding):
    import openai_harmony as h

    tokens = completion_tokens(
        reference_encoding, COMPLETIONS["analysis_then_final"], end_with_return=True
    )
    reference = h.StreamableParser(reference_encoding, role=h.Role.ASSISTANT)
    ours = HarmonyStreamParser(harmony_tokenizer)
    for token in tokens:
        reference.process(token)
        delta = ours.feed([token])
        expected = reference.last_content_delta or ""
        assert delta.reasoning + delta.content == expected


def test_model_style_call_header_parses(harmony_tokenizer, reference_encoding):
    """Models put `to=` after the channel; both positions must parse the same."""
    text = (
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location":"SF"}'
        "<|call|>"
    )
    tokens = reference_encoding.encode(text, allowed_special="all")
    parser = HarmonyStreamParser(harmony_tokenizer)
    delta = parser.feed(tokens) + parser.finish()
    assert [(c.name, c.arguments_json) for c in assemble_calls(delta.calls)] == [
        ("get_weather", '{"location":"SF"}')
    ]
    assert expected_from_reference(reference_encoding, tokens)[2] == [
        ("get_weather", '{"location":"SF"}')
    ]
    json.loads(assemble_calls(delta.calls)[0].arguments_json)
