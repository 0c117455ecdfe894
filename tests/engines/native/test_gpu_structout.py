"""Structured output and speculative decoding on CUDA (skipped without a GPU): overlap and
decode graphs on, masks copied and applied on the device, the Triton attention backend
verifying multi-token drafts."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from tokenizers import Tokenizer

from stator.protocols import GuidedDecoding
from tests.engines.native.models import core_for, greedy_request, prompt, run_all, tokens_of
from tests.engines.native.test_guided import REAL_SCHEMAS, request
from tests.engines.native.test_spec import repetitive_requests, spec_config, write_eagle3

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_constrained_batch_with_overlap_and_graphs(llama, dtype):
    model_dir, _ = llama
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    core = core_for(model_dir, device="cuda", dtype=dtype, kv_cache_memory="64MiB")
    assert core.overlap and core.runner.graphs is not None
    reqs = []
    for i, schema in enumerate(REAL_SCHEMAS):
        for t in (0.0, 1.0):
            reqs.append(
                request(f"j{i}{t}", GuidedDecoding(json_schema=schema), temperature=t, seed=i)
            )
    reqs.append(request("free", None, temperature=1.0, max_tokens=30))
    out = run_all(core, reqs)
    for i, schema in enumerate(REAL_SCHEMAS):
        for t in (0.0, 1.0):
            outputs = out[f"j{i}{t}"]
            assert outputs[-1].finish_reason == "stop"
            jsonschema.validate(json.loads(tok.decode(tokens_of(outputs))), schema)


@pytest.mark.parametrize("method", ["ngram", "self_draft", "eagle3"])
def test_cuda_speculative_greedy_matches_plain(llama, tmp_path, method):
    target, _ = llama
    opts = {"device": "cuda", "dtype": "float32", "kv_cache_memory": "64MiB"}
    plain = run_all(core_for(target, **opts), repetitive_requests())
    if method == "ngram":
        config = spec_config("ngram")
    elif method == "self_draft":
        config = spec_config("draft_model", 3, target)
    else:
        config = spec_config("eagle3", 3, write_eagle3(tmp_path / "e3", target))
    core = core_for(target, speculative_config=config, **opts)
    replays = []
    verify = core.runner.verify_graphs
    if method != "eagle3":  # EAGLE-3 verifies eagerly (its head reads hidden states)
        assert (
            verify is not None
            and verify.tokens_per_seq == 1 + core.specdec.config.num_speculative_tokens
        )
        run = verify.run
        verify.run = lambda ids, ctx: replays.append(ids.shape[0]) or run(ids, ctx)
    out = run_all(core, repetitive_requests())
    for rid, outputs in plain.items():
        assert tokens_of(out[rid]) == tokens_of(outputs), rid
    if method == "self_draft":  # k drafts for every sequence: full verify steps happen
        assert replays
    if method == "self_draft":
        assert core.specdec.stats.acceptance_rate > 0.95


def test_cuda_sampled_speculation_runs(llama):
    target, _ = llama
    core = core_for(
        target,
        device="cuda",
        dtype="bfloat16",
        kv_cache_memory="64MiB",
        speculative_config=spec_config("draft_model", 4, target),
    )
    reqs = [greedy_request(f"s{i}", prompt(i, 9), 20, temperature=1.0, seed=i) for i in range(5)]
    out = run_all(core, reqs)
    assert all(len(tokens_of(out[r.request_id])) == 20 for r in reqs)
