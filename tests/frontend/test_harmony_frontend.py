"""GPT-OSS through the frontend: Harmony prompts, `<|return|>`/`<|call|>` stops and
token-level parsing, on the real o200k_harmony vocabulary (rebuilt offline; skipped with
the reason when it cannot be) and scripted engines that emit Harmony tokens."""

from __future__ import annotations

import json

import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from stator.parsers.harmony import HarmonyRenderer, chat_to_harmony
from tests.fakes import ScriptedEngine
from tests.frontend.harness import Stack
from tests.parsers.harmony_vocab import VocabUnavailable, o200k_harmony_tokenizer_json

ANSWER = "test/gpt-oss-answer"
CALL = "test/gpt-oss-call"
ANSWER_TEXT = (
    "<|channel|>analysis<|message|>The user says hi. Reply briefly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hi! How can I help? 🙂<|return|>"
)
CALL_TEXT = (
    "<|channel|>analysis<|message|>Need the weather first.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
USER = [{"role": "user", "content": "Hi there"}]
HARMONY_CARD = {"reasoning_parser": "gpt_oss", "tool_call_parser": "harmony"}


@pytest.fixture(scope="module")
def harmony_tokenizer():
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(o200k_harmony_tokenizer_json()))
    except VocabUnavailable as exc:
        pytest.skip(f"o200k_harmony vocabulary cannot be built offline: {exc}")


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory, harmony_tokenizer):
    """A GPT-OSS-like model directory (its generation_config lists <|return|> and <|call|>
    as EOS, as the real one does) and a stack serving two scripted GPT-OSS workers."""
    path = tmp_path_factory.mktemp("gpt-oss") / "model"
    path.mkdir()
    (path / "tokenizer.json").write_text(o200k_harmony_tokenizer_json().read_text())
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|return|>", "pad_token": "<|endoftext|>"})
    )
    (path / "config.json").write_text(
        json.dumps({"model_type": "gpt_oss", "max_position_embeddings": 131072})
    )
    (path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [200002, 199999, 200012]})
    )
    stack = Stack(path).start()
    engines = {}
    try:
        for i, (name, text) in enumerate([(ANSWER, ANSWER_TEXT), (CALL, CALL_TEXT)]):
            script = harmony_tokenizer.encode(text, add_special_tokens=False).ids
            engine = ScriptedEngine(name, script=script)
            stack.add_worker(engine, f"stator.oss{i}.generate", wait_model=name, **HARMONY_CARD)
            engines[name] = engine
        yield stack, engines
    finally:
        stack.stop()


@pytest.fixture
def client(gpt_oss):
    stack, _ = gpt_oss
    with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def streamed(client, **kw):
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            assert "<|" not in (choice.delta.content or "")
        state.handle_chunk(chunk)
    return state.get_final_completion()


def test_prompt_is_rendered_as_harmony_with_stop_tokens(client, gpt_oss, harmony_tokenizer):
    _, engines = gpt_oss
    client.chat.completions.create(
        model=CALL, messages=USER, tools=[WEATHER], reasoning_effort="low"
    )
    request = engines[CALL].requests[-1]
    expected = HarmonyRenderer(harmony_tokenizer).render_for_completion(
        chat_to_harmony(USER, tools=[WEATHER], reasoning_effort="low")
    )
    assert request.token_ids == expected
    assert {200002, 200012} <= set(request.stop.stop_token_ids)
    assert not {200002, 200012} & set(request.stop.stop_token_ids_hidden)


@pytest.mark.parametrize(
    ("messages", "extra", "param"),
    [
        (USER, {"reasoning_effort": "minimal"}, "reasoning_effort"),
        ([*USER, {"role": "assistant", "tool_calls": ["not an object"]}], {}, "messages"),
        ([*USER, {"role": "assistant", "reasoning": 5, "content": "x"}], {}, "messages"),
        ([*USER, {"role": "tool", "tool_call_id": "nope", "content": "x"}], {}, "messages"),
    ],
    ids=["minimal-effort", "call-not-an-object", "reasoning-not-text", "unknown-call-id"],
)
def test_bad_harmony_chat_is_400(client, messages, extra, param):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=CALL, messages=messages, extra_body=extra)
    assert raised.value.body["param"] == param


def test_reasoning_and_answer(client):
    r = client.chat.completions.create(model=ANSWER, messages=USER)
    message = r.choices[0].message
    assert message.content == "Hi! How can I help? 🙂"
    assert message.model_extra["reasoning_content"] == "The user says hi. Reply briefly."
    assert message.model_extra["reasoning"] == "The user says hi. Reply briefly."
    assert r.choices[0].finish_reason == "stop"
    final = streamed(client, model=ANSWER, messages=USER)
    assert final.choices[0].message.content == message.content


def test_tool_call_streamed_equals_non_streamed(client):
    r = client.chat.completions.create(model=CALL, messages=USER, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [
        (c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls
    ] == [("get_weather", {"city": "Paris"})]
    assert not choice.message.content
    final = streamed(client, model=CALL, messages=USER, tools=[WEATHER])
    calls = final.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert final.choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_hides_the_call(client):
    r = client.chat.completions.create(
        model=CALL, messages=USER, tools=[WEATHER], tool_choice="none"
    )
    assert not r.choices[0].message.tool_calls
    assert "<|" not in (r.choices[0].message.content or "")


def test_responses_api_on_harmony(client, gpt_oss, harmony_tokenizer):
    _, engines = gpt_oss
    tools = [
        {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    ]
    r = client.responses.create(
        model=CALL, input="Weather?", tools=tools, reasoning={"effort": "high"}
    )
    assert [item.type for item in r.output] == ["reasoning", "function_call"]
    call = r.output[1]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    prompt = harmony_tokenizer.decode(
        engines[CALL].requests[-1].token_ids, skip_special_tokens=False
    )
    assert "Reasoning: high" in prompt
    # The tool's answer goes back in the next turn, the call's reasoning kept with it.
    follow = client.responses.create(
        model=ANSWER,
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}],
        tools=tools,
    )
    assert follow.output_text == "Hi! How can I help? 🙂"
    prompt = harmony_tokenizer.decode(
        engines[ANSWER].requests[-1].token_ids, skip_special_tokens=False
    )
    assert "Need the weather first." in prompt
    assert "<|start|>functions.get_weather<|channel|>commentary to=assistant" in prompt
    events = list(client.responses.create(model=ANSWER, input="Hi", stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "Hi! How can I help? 🙂"
