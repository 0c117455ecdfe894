"""The fused-epilogue path of the dense decoder layers (`epilogues.py`, models/llama.py) run
on the CPU under Triton's interpreter: a prefill step (30 rows: finished outputs) and a
decode step (2 rows: split-K partial sums, gate/up through the gated GEMV) give the logits
of the unfused layers with the same GEMV configs, for Llama, Qwen2 (q/k/v bias) and GPT-OSS
(biases, sinks, a sliding window, experts: their output goes to the next norm). On the
CPU the engine never takes this path (`epilogues.active`); the check forces it."""

from __future__ import annotations

from tests.engines.native.triton_interpreter import NUMPY2_INDEX_PATCH, run_interpreted

_CHECK = (
    NUMPY2_INDEX_PATCH
    + r"""
from types import SimpleNamespace

import torch

from stator.engines.native import epilogues
from stator.engines.native.kernels.gemv import GemvConfig
from stator.engines.native.layers import Linear
from tests.engines.native.models import core_for, prompt


def seq(tokens, computed, blocks):
    return SimpleNamespace(token_ids=tokens, num_computed_tokens=computed,
                           num_prompt_tokens=len(tokens), block_ids=blocks, prompt_embeds=None)


for model_dir in MODEL_DIRS:
    runner = core_for(model_dir).runner
    for module in runner.model.modules():
        if isinstance(module, Linear):
            module.gemv_config = module.epilogue_gemv = GemvConfig(16, 32, 2)
    runner.backend.stores_by_slot = True  # the torch backend stores row t at slot t too
    a, b = prompt(1, 21), prompt(2, 9)
    steps = [
        ([seq(a, 0, [1, 2]), seq(b, 0, [3])], [21, 9], [20, 29]),
        ([seq([*a, 7], 21, [1, 2]), seq([*b, 8], 9, [3])], [1, 1], [0, 1]),
    ]
    logits = {}
    for fused in (False, True):
        epilogues.active = lambda x, fused=fused: fused
        logits[fused] = [runner.execute(runner.prepare(*step)) for step in steps]
    for want, got in zip(logits[False], logits[True]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
print("ok")
"""
)


def test_fused_layers_match_the_unfused_layers_in_the_interpreter(checkpoints):
    dirs = [str(checkpoints(name)[0]) for name in ("llama3", "qwen2", "gpt_oss")]
    run_interpreted(f"MODEL_DIRS = {dirs!r}\n" + _CHECK, timeout=600)
