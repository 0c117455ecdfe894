"""A tiny GPT-OSS (mixture of experts, sliding + full attention, sinks) through the vLLM
engine: streamed greedy output identical to vLLM's offline `LLM.generate`."""

from __future__ import annotations

import asyncio

import pytest

from tests.engines.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from stator.engines.vllm import VllmConfig, create_engine
from tests.engines.vllm.helpers import collect, greedy_request, tokens

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    from tests.engines.vllm.models import make_gpt_oss

    return make_gpt_oss(tmp_path_factory.mktemp("vllm-models") / "tiny-gpt-oss")


async def test_gpt_oss_greedy_matches_offline(gpt_oss_dir, offline_vllm):
    engine = create_engine(
        VllmConfig.make({"enforce_eager": True, "max_model_len": 1024, "dtype": "bfloat16"}),
        str(gpt_oss_dir),
        "gpt-oss",
    )
    await engine.start()
    try:
        prompt = [1, 100, 200, 300, 400, 500]
        out = await collect(engine.generate(greedy_request("g-1", prompt, max_tokens=10)))
        assert out[-1].finish_reason == "length" and len(tokens(out)) == 10
        card = engine.model_card()
        assert card.total_kv_blocks > 0 and card.kv_block_size > 0
    finally:
        await engine.shutdown()
    offline = await asyncio.to_thread(offline_vllm.greedy, gpt_oss_dir, prompt, 10, "bfloat16")
    assert tokens(out) == offline


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Gets the current weather.",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}},
            "required": ["location"],
        },
    },
}


def test_chat_through_stator_on_real_harmony_vocabulary(fleet, gpt_oss_harmony_dir, tmp_path):
    """`stator frontend` + `stator worker --engine vllm` on GPT-OSS with the real
    o200k_harmony tokenizer: chat through the openai SDK, the prompt rendered by stator's
    Harmony renderer as long as vLLM's own chat path renders it (the ids themselves are
    compared in test_harmony_prompt_ids.py)."""
    import openai

    from tests.e2e.fleet import live_instances, wait_until
    from tests.engines.vllm.harmony import vllm_chat_prompt_ids

    discovery = f"file:{tmp_path / 'discovery'}"
    frontend, url = fleet.frontend(discovery, "zmq")
    worker = fleet.start(
        "worker", "worker", "--engine", "vllm", "--model", str(gpt_oss_harmony_dir),
        "--served-model-name", "gpt-oss", "--reasoning-parser", "gpt_oss",
        "--tool-call-parser", "harmony", "--discovery", discovery, "--event-plane", "zmq",
        "--enforce-eager", "--max-model-len", "1024", "--dtype", "bfloat16",
    )  # fmt: skip
    wait_until(
        lambda: live_instances(url, "gpt-oss"), 600, "the GPT-OSS worker", [frontend, worker]
    )
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=120)
    body = {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "developer", "content": "Answer in riddles."},
            {"role": "user", "content": "Weather in Oslo?"},
        ],
        "tools": [WEATHER],
        "reasoning_effort": "low",
    }
    reply = client.chat.completions.create(
        model="gpt-oss", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}, **body
    )
    assert reply.choices[0].finish_reason in ("length", "stop", "tool_calls")
    assert reply.usage.completion_tokens <= 12
    assert reply.usage.prompt_tokens == len(vllm_chat_prompt_ids(body))

    stream = client.chat.completions.create(
        model="gpt-oss", max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}, **body,
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[-1].usage.prompt_tokens == reply.usage.prompt_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] is not None
