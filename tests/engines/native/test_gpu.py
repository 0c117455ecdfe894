"""The same engine on CUDA (skipped without a GPU): the tensor code has no CPU assumptions."""

from __future__ import annotations

import pytest
import torch

from tests.engines.native.models import (
    core_for,
    greedy_request,
    hf_greedy,
    prompt,
    run_all,
    tokens_of,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_cuda_float32_greedy_matches_transformers(llama):
    model_dir, hf = llama
    ids = prompt(2, 37)
    expected = hf_greedy(hf, ids, 32)
    core = core_for(model_dir, device="cuda", dtype="float32")
    assert core.runner.device.type == "cuda"
    assert tokens_of(run_all(core, [greedy_request("r", ids, 32)])["r"]) == expected


def test_cuda_mixed_batch_with_sampling_and_prefix_cache(llama):
    model_dir, _ = llama
    core = core_for(model_dir, device="cuda", dtype="bfloat16", max_num_batched_tokens=64)
    reqs = [
        greedy_request("a", prompt(3, 40), 16),
        greedy_request("b", prompt(4, 7), 16, temperature=0.8, top_p=0.9, top_k=50, seed=5),
        greedy_request("c", prompt(5, 70), 16, logprobs=3, repetition_penalty=1.2),
    ]
    out = run_all(core, reqs)
    assert all(len(tokens_of(out[r.request_id])) == 16 for r in reqs)
    again = run_all(core, [greedy_request("a2", prompt(3, 40), 16)])["a2"]
    assert again[0].cached_tokens == 32
    assert core.blocks.num_used_blocks == 0
