"""A tiny GPT-OSS (mixture of experts, sliding + full attention, sinks) through the vLLM
engine: streamed greedy output identical to vLLM's offline `LLM.generate`."""

from __future__ import annotations

import asyncio

import pytest

from tests.engines.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from stator.engines.vllm import VllmConfig, create_engine
from tests.engines.vllm.helpers import collect, greedy_request, offline_greedy, tokens

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    from tests.engines.vllm.models import make_gpt_oss

    return make_gpt_oss(tmp_path_factory.mktemp("vllm-models") / "tiny-gpt-oss")


async def test_gpt_oss_greedy_matches_offline(gpt_oss_dir, tmp_path):
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
    offline = await asyncio.to_thread(offline_greedy, gpt_oss_dir, prompt, 10, tmp_path, "bfloat16")
    assert tokens(out) == offline
