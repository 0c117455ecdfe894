"""End to end: `stator frontend --processor vllm` in front of a mocker worker and of a
vLLM worker, driven with the openai SDK: chat, streaming, tools and reasoning.

The mocker worker runs in echo mode on a model whose template is the last message's text,
so it answers with exactly the reasoning and tool call the request wrote (and the EOS
after them): the parsers' output is known. The vLLM worker's tiny model has random
weights: its answers are checked for shape, not text."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here (run .ci/vllm.sh)")

import openai

from tests.e2e.fleet import live_instances, wait_until
from tests.frontend.processor.corpus import WEATHER
from tests.frontend.processor.models import echo_model, tools_model_with_weights

pytestmark = pytest.mark.integration

PARSERS = ("--reasoning-parser", "qwen3", "--tool-call-parser", "hermes")
SCRIPT = (
    "<think>Oslo needs a lookup.</think>"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    "<|im_end|>"
)
ANSWER = "<think>Greet back.</think>Hello there, friend!<|im_end|>"


@pytest.fixture(scope="module")
def frontend(module_fleet, tmp_path_factory):
    """One `stator frontend --processor vllm` for the module (it imports vLLM: seconds),
    each test's worker serving its own model, on its own endpoint, behind it."""
    discovery = f"file:{tmp_path_factory.mktemp('processor-e2e') / 'discovery'}"
    proc, url = module_fleet.frontend(discovery, "zmq", "--processor", "vllm")
    return module_fleet, proc, url, discovery


def start(frontend, model: str, *worker_args: str):
    fleet, proc, url, discovery = frontend
    worker = fleet.start(
        "worker", "worker", "--served-model-name", model, "--endpoint", f"{model}.generate",
        "--discovery", discovery, "--event-plane", "zmq", "--discovery-ttl", "5", *PARSERS,
        *worker_args,
    )  # fmt: skip
    wait_until(lambda: len(live_instances(url, model)) == 1, 600, "the worker", [proc, worker])
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=300)


def test_mocker_worker_behind_vllm_processor(frontend, tmp_path):
    model_dir = echo_model(tmp_path / "echo")
    client = start(
        frontend, "m", "--engine", "mocker", "--model", str(model_dir), "--output-mode", "echo"
    )

    # Reasoning and content, not streamed.
    reply = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": ANSWER}], max_tokens=200
    )
    message = reply.choices[0].message
    assert message.content == "Hello there, friend!"
    assert message.model_extra["reasoning_content"] == "Greet back."
    assert reply.choices[0].finish_reason == "stop"

    # A tool call, not streamed.
    reply = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": SCRIPT}], tools=[WEATHER], max_tokens=200
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert choice.message.model_extra["reasoning_content"] == "Oslo needs a lookup."

    # The same call, streamed: reasoning pieces, then the call's name and arguments.
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": SCRIPT}],
        tools=[WEATHER],
        max_tokens=200,
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning, name, arguments, finish, usage = "", None, "", None, None
    for chunk in stream:
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for piece in delta.tool_calls or ():
            name = piece.function.name or name
            arguments += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert reasoning == "Oslo needs a lookup."
    assert name == "get_weather" and json.loads(arguments) == {"city": "Oslo"}
    assert finish == "tool_calls"
    assert usage is not None and usage.completion_tokens > 0

    # The Responses API on the same pipeline: reasoning and message items, streamed too.
    response = client.responses.create(model="m", input=ANSWER, max_output_tokens=200)
    assert response.output_text == "Hello there, friend!"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    events = list(
        client.responses.create(model="m", input=ANSWER, max_output_tokens=200, stream=True)
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Hello there, friend!" and events[-1].type == "response.completed"

    # What vLLM's processor cannot pass on is a 400 naming the field.
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": ANSWER}],
            extra_body={"truncate_prompt_tokens": 4},
        )
    assert "truncate_prompt_tokens" in str(refused.value)


def test_vllm_worker_behind_vllm_processor(frontend, tmp_path):
    model_dir = tools_model_with_weights(tmp_path / "llama-tools")
    client = start(
        frontend, "v", "--engine", "vllm", "--model", str(model_dir),
        "--enforce-eager", "--max-model-len", "1024", "--dtype", "float32",
    )  # fmt: skip
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]

    reply = client.chat.completions.create(
        model="v", messages=ask, tools=[WEATHER], max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert reply.usage.completion_tokens == 8
    assert reply.choices[0].finish_reason in ("length", "tool_calls")

    stream = client.chat.completions.create(
        model="v",
        messages=ask,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 8
    text = "".join(
        (c.choices[0].delta.content or "")
        + ((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "")
        for c in chunks
        if c.choices
    )
    assert text  # random weights: some text, as reasoning or content

    # Thinking switched off through the template: all of it is content.
    reply = client.chat.completions.create(
        model="v",
        messages=ask,
        max_tokens=8,
        extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}},
    )
    assert reply.choices[0].message.content
    assert not reply.choices[0].message.model_extra.get("reasoning_content")
