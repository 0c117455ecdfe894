"""vLLM in the prefill and decode roles: the connector config, the kv_transfer_params
mapping, and (CPU build, ExampleConnector through a shared directory) the two halves of
one request."""

from __future__ import annotations

import asyncio

import pytest

from tests.engines.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from stator.engines.vllm import VllmConfig, create_engine
from stator.engines.vllm.disagg import kv_transfer_config, prefill_params, request_kv_params
from stator.protocols import DisaggParams
from stator.router.disagg_requests import decode_request, prefill_request
from tests.engines.vllm.helpers import TEST_ENGINE_ARGS, collect, greedy_request, tokens


def test_connector_per_role_and_platform():
    assert kv_transfer_config("aggregated", True) is None
    assert kv_transfer_config("prefill", True) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
    }
    cpu = kv_transfer_config("decode", False, storage="/x")
    assert cpu["kv_connector"] == "ExampleConnector"
    assert cpu["kv_connector_extra_config"] == {"shared_storage_path": "/x"}


def test_kv_transfer_params_both_ways():
    req = greedy_request("r", [1, 2, 3, 4], 4)
    assert request_kv_params(req) is None
    pre = prefill_request(req)
    assert request_kv_params(pre) == {"do_remote_decode": True, "do_remote_prefill": False}
    params = prefill_params(5, pre, {"remote_block_ids": [1], "remote_engine_id": "e"}, 16)
    assert params.prefill_worker_id == 5 and params.transfer["vllm"]["remote_engine_id"] == "e"
    assert prefill_params(5, req, {"x": 1}, 16) is None  # not a prefill request
    from stator.protocols import EngineOutput

    out = EngineOutput(token_ids=[9], finish_reason="length", disagg=params)
    dec = decode_request(req, out, params)
    kv = request_kv_params(dec)
    assert kv["do_remote_prefill"] is True and kv["remote_engine_id"] == "e"
    # A native prefill worker's KV: vLLM does not pull it.
    native = DisaggParams(prefill_worker_id=1, transfer={"kind": "tcp"})
    assert request_kv_params(decode_request(req, out, native)) is None


@pytest.mark.integration
async def test_prefill_and_decode_halves_on_the_cpu_build(llama_dir, offline_vllm):
    args = {**TEST_ENGINE_ARGS}
    engines = []
    try:
        for role in ("prefill", "decode"):
            eng = create_engine(VllmConfig.make(dict(args)), str(llama_dir), "tiny")
            eng.role = role
            eng.worker_id = len(engines) + 1
            engines.append(eng)
        for eng in engines:
            await eng.start()
        prefill, decode = engines
        assert prefill.model_card().role == "prefill"
        req = greedy_request("r1", list(range(5, 70)), 6)
        # The request served whole: vLLM's offline generate (prompt embeddings on, as the
        # other llama references ask, so that its child keeps one engine for them all).
        expected = await asyncio.to_thread(
            offline_vllm.greedy, llama_dir, req.token_ids, 6, prompt_embeds=True
        )
        pre = await collect(prefill.generate(prefill_request(req)))
        final = pre[-1]
        assert final.finish_reason == "length" and final.disagg is not None
        assert "vllm" in final.disagg.transfer
        dec = await collect(decode.generate(decode_request(req, final, final.disagg)))
        assert final.token_ids + tokens(dec) == expected
    finally:
        for eng in engines:
            await eng.shutdown()
