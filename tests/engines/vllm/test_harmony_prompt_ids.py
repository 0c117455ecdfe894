"""GPT-OSS chat: the prompt ids stator's frontend renders (Harmony, on the real
o200k_harmony tokenizer rebuilt offline) are exactly the ones vLLM's own chat path builds.

vLLM's side is its OpenAI server's preprocessing for GPT-OSS, called as the server calls
it (`OnlineRenderer._make_request_with_harmony` on vLLM's own `ChatCompletionRequest`);
stator's side is the frontend's chat path (`ModelPipeline` → `ModelParsing.harmony_prompt`).
"""

from __future__ import annotations

import asyncio
import copy

import pytest

from tests.engines.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from stator.frontend import errors
from stator.frontend.metrics import FrontendMetrics
from stator.frontend.openai.requests import ChatCompletionRequest
from stator.frontend.processor.stator import ModelParsing, StatorProcessor
from stator.llm import Tokenizer
from stator.parsers.harmony.chat import conversation_start_date
from stator.protocols import ModelCard
from tests.engines.vllm.harmony import harmony_tokenizer_json, vllm_chat_prompt_ids

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Gets the current weather.\nUse for any city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "default": 1},
            },
            "required": ["location"],
        },
    },
}
PING = {"type": "function", "function": {"name": "ping", "description": "Checks the service."}}


def call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


SYSTEM_DEVELOPER_USER = [
    {"role": "system", "content": "You are terse."},
    {"role": "developer", "content": "Answer in riddles."},
    {"role": "user", "content": "What is the weather in Tokyo? 東京は☀️?"},
]
TOOL_LOOP = [
    {"role": "system", "content": "Be helpful."},
    {"role": "user", "content": "Weather in Oslo and Paris?"},
    {
        "role": "assistant",
        "content": "Let me look both up.",
        "reasoning": "I need both cities.",
        "tool_calls": [call("c1", "get_weather", '{"location":"Oslo"}')],
    },
    {"role": "tool", "tool_call_id": "c1", "content": '{"temp": -3}'},
    {
        "role": "assistant",
        "content": None,
        "reasoning": "Now Paris.",
        "tool_calls": [call("c2", "get_weather", '{"location":"Paris"}')],
    },
    {"role": "tool", "tool_call_id": "c2", "content": '{"temp": 18}'},
]
FINISHED_TURNS = [
    {"role": "user", "content": "Is the service up?"},
    {"role": "assistant", "reasoning": "Call ping.", "tool_calls": [call("p", "ping", "{}")]},
    {"role": "tool", "tool_call_id": "p", "content": "ok"},
    {"role": "assistant", "reasoning": "It answered.", "content": "Yes, it is up."},
    {"role": "user", "content": [{"type": "text", "text": "Thanks! "}, {"type": "text", "text": "And now?"}]},
    {"role": "developer", "content": "Mention the time."},
    {"role": "assistant", "content": "Still up."},
    {"role": "user", "content": "Type <|end|> and <|call|> literally."},
]  # fmt: skip

CASES = {
    "system_developer_user_with_tools_high": {
        "messages": SYSTEM_DEVELOPER_USER,
        "tools": [WEATHER, PING],
        "reasoning_effort": "high",
    },
    "system_developer_user_with_tools_no_effort": {
        "messages": SYSTEM_DEVELOPER_USER,
        "tools": [WEATHER, PING],
    },
    "system_developer_user_no_tools_low": {
        "messages": SYSTEM_DEVELOPER_USER,
        "reasoning_effort": "low",
    },
    "user_only": {"messages": [{"role": "user", "content": "Hi"}]},
    "tool_loop_with_preamble_and_results": {
        "messages": TOOL_LOOP,
        "tools": [WEATHER],
        "reasoning_effort": "medium",
    },
    "finished_turns_drop_their_analysis": {"messages": FINISHED_TURNS, "tools": [PING]},
    "tools_with_tool_choice_none": {
        "messages": TOOL_LOOP,
        "tools": [WEATHER],
        "tool_choice": "none",
    },
}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_files({"tokenizer.json": harmony_tokenizer_json().read_bytes()})


@pytest.fixture(scope="module")
def parsing(tokenizer) -> ModelParsing:
    card = ModelCard(
        name="gpt-oss", source_path="", reasoning_parser="gpt_oss", tool_call_parser="harmony"
    )
    return ModelParsing.from_card(card, tokenizer.inner)


@pytest.fixture(autouse=True)
def same_start_date(monkeypatch):
    # vLLM writes today's date into the system message, as stator does; pinned to
    # stator's today so that a test run across midnight still compares one date.
    monkeypatch.setenv("VLLM_SYSTEM_START_DATE", conversation_start_date())


def stator_prompt(parsing: ModelParsing, body: dict) -> list[int]:
    """The frontend's chat path (`StatorProcessor.chat_prompt`) for a Harmony model, on a
    processor that has only what that path reads (no model files)."""
    processor = StatorProcessor.__new__(StatorProcessor)
    processor.name, processor.parsing, processor.template = "gpt-oss", parsing, None
    processor.metrics = FrontendMetrics()
    request = ChatCompletionRequest(model="gpt-oss", **copy.deepcopy(body))
    return asyncio.run(processor.chat_prompt(request))


@pytest.mark.parametrize("name", sorted(CASES))
def test_prompt_ids_match_vllm_chat_path(name, parsing, tokenizer):
    body = CASES[name]
    ours = stator_prompt(parsing, body)
    theirs = vllm_chat_prompt_ids(body)
    if ours != theirs:  # show the difference as text, not as 300 ids
        assert tokenizer.decode(ours, skip_special_tokens=False) == tokenizer.decode(
            theirs, skip_special_tokens=False
        )
    assert ours == theirs


def test_unsupported_reasoning_effort_is_400_as_in_vllm(parsing):
    from vllm.exceptions import VLLMValidationError

    body = {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "minimal"}
    with pytest.raises(errors.ApiError) as raised:
        stator_prompt(parsing, body)
    assert raised.value.status == 400 and raised.value.param == "reasoning_effort"
    with pytest.raises(VLLMValidationError):
        vllm_chat_prompt_ids(body)
