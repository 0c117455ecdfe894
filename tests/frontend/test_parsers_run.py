"""End to end: `stator run` with the mocker echoing its prompt and `--tool-call-parser
hermes`. The echo stops at the user turn's end token, so the model "says" the user's
message: a message holding a Hermes call comes back as a parsed tool call, through the
worker host, the model card and the frontend."""

from __future__ import annotations

import json

import openai
import pytest

from tests.procs import free_port, stator_process, wait_healthy

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}


@pytest.mark.integration
def test_stator_run_parses_tool_calls_of_an_echoing_mocker(tiny_model_dir):
    port = free_port()
    proc = stator_process(
        "run",
        "--engine", "mocker",
        "--output-mode", "echo",
        "--speedup-ratio", "100",
        "--model", str(tiny_model_dir),
        "--served-model-name", "echo/hermes",
        "--tool-call-parser", "hermes",
        "--host", "127.0.0.1",
        "--port", str(port),
    )  # fmt: skip
    try:
        wait_healthy(proc, port, timeout=90)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": CALL}]
        r = client.chat.completions.create(model="echo/hermes", messages=messages, tools=[WEATHER])
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        [call] = choice.message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == (
            "get_weather",
            {"city": "Paris"},
        )
        assert "<tool_call>" not in (choice.message.content or "")
        calls = {}
        for chunk in client.chat.completions.create(
            model="echo/hermes", messages=messages, tools=[WEATHER], stream=True
        ):
            for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
        assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
            ("get_weather", {"city": "Paris"})
        ]
        # Without tools the same text is plain content.
        r = client.chat.completions.create(model="echo/hermes", messages=messages)
        assert CALL in r.choices[0].message.content
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except Exception:
            proc.kill()
            proc.wait()
