"""Reasoning and tool-call parsing through a real server, checked with the `openai` SDK:
models whose output is scripted (see parser_stack.py), streamed and not."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from stator.llm import Tokenizer
from stator.parsers.harmony import HarmonyVocabularyError
from tests.fakes import ScriptedEngine
from tests.frontend.parser_stack import (
    NO_CALL,
    NO_PARSER,
    ONE_CALL,
    THINK,
    THINK_TEXT,
    TOOLS,
    TOOLS_LIST,
    TOOLS_TEXT,
    WEATHER_TOOL,
)

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>")


@pytest.fixture
def client(parser_client):
    return parser_client


@pytest.fixture
def engines(parser_stack):
    return parser_stack[1]


def streamed(client, **kw):
    """(the completion the SDK rebuilds from the chunks, the chunks)."""
    state = ChatCompletionStreamState()
    chunks = []
    for chunk in client.chat.completions.create(stream=True, **kw):
        chunks.append(chunk)
        state.handle_chunk(chunk)
    return state.get_final_completion(), chunks


def prompt_text(parser_stack, engine) -> str:
    return Tokenizer.from_dir(parser_stack[0].model_dir).decode(engine.requests[-1].token_ids)


def reasoning_of(message) -> tuple[str | None, str | None]:
    extra = message.model_extra or {}
    return extra.get("reasoning_content"), extra.get("reasoning")


def calls_of(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_reasoning_split_non_streamed(client):
    r = client.chat.completions.create(model=THINK, messages=USER)
    message = r.choices[0].message
    assert message.content == "Hello there, friend!"
    assert reasoning_of(message) == ("I should greet them.", "I should greet them.")
    assert r.choices[0].finish_reason == "stop"


def test_reasoning_split_streamed_equals_non_streamed(client):
    final, chunks = streamed(client, model=THINK, messages=USER)
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content", "")
        for c in chunks
        if c.choices
    )
    alias = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning", "") for c in chunks if c.choices
    )
    assert reasoning == alias == "I should greet them."
    assert final.choices[0].message.content == "Hello there, friend!"
    assert final.choices[0].finish_reason == "stop"


def test_include_reasoning_false_drops_it(client):
    r = client.chat.completions.create(
        model=THINK, messages=USER, extra_body={"include_reasoning": False}
    )
    assert r.choices[0].message.content == "Hello there, friend!"
    assert reasoning_of(r.choices[0].message) == (None, None)
    _, chunks = streamed(
        client, model=THINK, messages=USER, extra_body={"include_reasoning": False}
    )
    for chunk in chunks:
        for choice in chunk.choices:
            assert "reasoning_content" not in (choice.delta.model_extra or {})
            assert not any(m in (choice.delta.content or "") for m in MARKERS)


def test_model_without_parsers_passes_text_through(client):
    r = client.chat.completions.create(model=NO_PARSER, messages=USER)
    assert r.choices[0].message.content == THINK_TEXT
    assert reasoning_of(r.choices[0].message) == (None, None)


def test_tool_calls_non_streamed(client):
    r = client.chat.completions.create(model=TOOLS, messages=USER, tools=TOOLS_LIST)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert calls_of(choice.message) == [
        ("get_weather", {"city": "Paris", "unit": "°C"}),
        ("get_time", {"tz": "CET"}),
    ]
    assert all(c.id.startswith("call_") and c.type == "function" for c in choice.message.tool_calls)
    assert choice.message.content == "Let me check."
    assert reasoning_of(choice.message)[0] == "Weather and time are needed."


def test_streamed_tool_calls_rebuilt_by_sdk_equal_non_streamed(client):
    plain = client.chat.completions.create(model=TOOLS, messages=USER, tools=TOOLS_LIST)
    final, chunks = streamed(client, model=TOOLS, messages=USER, tools=TOOLS_LIST)
    assert calls_of(final.choices[0].message) == calls_of(plain.choices[0].message)
    assert final.choices[0].message.content == plain.choices[0].message.content
    assert final.choices[0].finish_reason == "tool_calls"
    # As OpenAI streams them: the first piece of a call has index, id, type and name.
    firsts = {}
    for chunk in chunks:
        for choice in chunk.choices:
            assert not any(m in (choice.delta.content or "") for m in MARKERS)
            for call in choice.delta.tool_calls or []:
                if call.index not in firsts:
                    firsts[call.index] = call
    assert sorted(firsts) == [0, 1]
    for call in firsts.values():
        assert call.id and call.type == "function" and call.function.name


def test_tools_in_the_prompt(client, engines, parser_stack):
    client.chat.completions.create(model=TOOLS, messages=USER, tools=TOOLS_LIST)
    text = prompt_text(parser_stack, engines[TOOLS])
    assert '"get_weather"' in text and "# Tools" in text


def test_tool_choice_none_leaves_text_uncalled(client):
    r = client.chat.completions.create(
        model=ONE_CALL, messages=USER, tools=[WEATHER_TOOL], tool_choice="none"
    )
    assert r.choices[0].finish_reason == "stop"
    assert not r.choices[0].message.tool_calls


def test_tool_choice_required_and_named(client):
    r = client.chat.completions.create(
        model=ONE_CALL, messages=USER, tools=TOOLS_LIST, tool_choice="required"
    )
    assert calls_of(r.choices[0].message) == [("get_weather", {"city": "Oslo"})]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model=ONE_CALL, messages=USER, tools=TOOLS_LIST, tool_choice=named
    )
    assert r.choices[0].finish_reason == "tool_calls"
    final, _ = streamed(client, model=ONE_CALL, messages=USER, tools=TOOLS_LIST, tool_choice=named)
    assert calls_of(final.choices[0].message) == [("get_weather", {"city": "Oslo"})]


def test_required_without_a_call_is_a_model_error(client):
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(
            model=NO_CALL, messages=USER, tools=TOOLS_LIST, tool_choice="required"
        )
    assert info.value.status_code == 500
    assert info.value.body["type"] == "model_error"
    assert "required" in info.value.body["message"]
    with pytest.raises(openai.APIError, match="required"):
        streamed(client, model=NO_CALL, messages=USER, tools=TOOLS_LIST, tool_choice="required")


def test_named_choice_broken_by_another_call_is_a_model_error(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    with pytest.raises(openai.InternalServerError, match="get_time"):
        client.chat.completions.create(
            model=ONE_CALL, messages=USER, tools=TOOLS_LIST, tool_choice=named
        )


@pytest.mark.parametrize(
    ("model", "tools", "choice", "needle"),
    [
        (ONE_CALL, TOOLS_LIST, {"type": "function", "function": {"name": "nope"}}, "not among"),
        (ONE_CALL, None, "required", "no tools"),
        (NO_PARSER, [WEATHER_TOOL], "required", "tool-call parser"),
        (ONE_CALL, TOOLS_LIST, "sometimes", "tool_choice"),
        (ONE_CALL, TOOLS_LIST, {"type": "function"}, "tool_choice"),
    ],
)
def test_bad_tool_choice_is_a_400(client, model, tools, choice, needle):
    kw = {"tools": tools} if tools else {}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=USER, tool_choice=choice, **kw)
    assert needle in info.value.body["message"]
    assert info.value.body["param"] == "tool_choice"


def test_chat_template_kwargs_reach_template_and_parser(client, engines, parser_stack):
    # Thinking off: Qwen3's template writes an empty think block into the prompt and the
    # parser treats the output as the answer (no reasoning split).
    r = client.chat.completions.create(
        model=TOOLS,
        messages=USER,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    prompt = prompt_text(parser_stack, engines[TOOLS])
    assert prompt.endswith("<think>\n\n</think>\n")
    message = r.choices[0].message
    assert reasoning_of(message)[0] is None
    # No tools in this request: the calls' text stays in the content, markers included;
    # the think block is not parsed as reasoning with thinking off.
    assert message.content == TOOLS_TEXT


def test_n_choices_each_parsed(client):
    r = client.chat.completions.create(model=TOOLS, messages=USER, tools=TOOLS_LIST, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    for choice in r.choices:
        assert [name for name, _ in calls_of(choice.message)] == ["get_weather", "get_time"]
    final, _ = streamed(client, model=TOOLS, messages=USER, tools=TOOLS_LIST, n=2)
    for choice in final.choices:
        assert [name for name, _ in calls_of(choice.message)] == ["get_weather", "get_time"]


def test_unknown_parser_name_fails_the_model_loudly(parser_stack, tmp_path):
    stack, _ = parser_stack
    engine = ScriptedEngine("test/bad-parser", script=[5, 6])
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        stack.add_worker(
            engine,
            "stator.badparser.generate",
            wait_model="test/bad-parser",
            reasoning_parser="nonsense",
        )
    response = httpx.post(
        stack.base_url + "/v1/chat/completions",
        json={"model": "test/bad-parser", "messages": USER},
        timeout=30,
    )
    assert response.status_code == 500
    assert "unknown reasoning parser 'nonsense'" in response.json()["error"]["message"]


def test_harmony_card_without_harmony_vocabulary_fails_loudly(parser_stack):
    stack, _ = parser_stack
    engine = ScriptedEngine("test/fake-gpt-oss", script=[5, 6])
    with pytest.raises(HarmonyVocabularyError):
        stack.add_worker(
            engine,
            "stator.fakeoss.generate",
            wait_model="test/fake-gpt-oss",
            reasoning_parser="gpt_oss",
        )
    response = httpx.post(
        stack.base_url + "/v1/chat/completions",
        json={"model": "test/fake-gpt-oss", "messages": USER},
        timeout=30,
    )
    assert response.status_code == 500
    assert "Harmony special tokens" in response.json()["error"]["message"]


def test_marker_that_is_a_special_token_reaches_the_parser(tmp_path):
    """Mistral's `[TOOL_CALLS]` is a special token: decoding keeps special tokens for
    requests that parse calls, so the call is found (and never shown as content)."""
    from tokenizers import Tokenizer as RawTokenizer

    from tests.frontend.harness import Stack
    from tests.model_factory import make_model_dir

    model_dir = make_model_dir(tmp_path / "mistral-like")
    raw = RawTokenizer.from_file(str(model_dir / "tokenizer.json"))
    raw.add_special_tokens(["[TOOL_CALLS]"])
    raw.save(str(model_dir / "tokenizer.json"))
    tokenizer = Tokenizer.from_dir(model_dir)
    eos = tokenizer.eos_token_ids[0]
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]'
    script = [*tokenizer.encode(text), eos]
    assert tokenizer.token_to_id("[TOOL_CALLS]") in script
    stack = Stack(model_dir, store="frontend-tests-mistral").start()
    try:
        engine = ScriptedEngine(
            "test/mistral", script=script, eos_token_id=eos, structured_output=False
        )
        stack.add_worker(
            engine, "stator.mistral.generate", wait_model="test/mistral", tool_call_parser="mistral"
        )
        with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0) as c:
            r = c.chat.completions.create(model="test/mistral", messages=USER, tools=[WEATHER_TOOL])
            assert calls_of(r.choices[0].message) == [("get_weather", {"city": "Rome"})]
            assert not r.choices[0].message.content
            final, _ = streamed(c, model="test/mistral", messages=USER, tools=[WEATHER_TOOL])
            assert calls_of(final.choices[0].message) == [("get_weather", {"city": "Rome"})]
            # No tools: nothing is parsed and special tokens are skipped as asked.
            r = c.chat.completions.create(model="test/mistral", messages=USER)
            assert r.choices[0].message.content == text.removeprefix("[TOOL_CALLS]")
    finally:
        stack.stop()


def test_streamed_with_logprobs_requested_keeps_the_split(client):
    # logprobs=True sends every delta through the general chunk path.
    final, chunks = streamed(client, model=TOOLS, messages=USER, tools=TOOLS_LIST, logprobs=True)
    plain = client.chat.completions.create(model=TOOLS, messages=USER, tools=TOOLS_LIST)
    assert calls_of(final.choices[0].message) == calls_of(plain.choices[0].message)
    assert final.choices[0].message.content == plain.choices[0].message.content
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning", "") for c in chunks if c.choices
    )
    assert reasoning == "Weather and time are needed."
