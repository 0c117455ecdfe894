"""LoRA and sleep mode on CUDA: the Triton LoRA kernels against the torch path, the
engine's mixed-adapter decode (CUDA graphs with LoRA) against the CPU engine, and sleep
freeing the device memory."""

from __future__ import annotations

import json

import pytest
import torch

from stator.engines.native.lora.adapter import load_adapter
from stator.engines.native.lora.batch import build_lora_batch
from stator.engines.native.lora.layer import LoraLayer
from tests.engines.native.lora_adapters import write_random_adapter
from tests.engines.native.models import core_for, greedy_request, prompt, run_all, tokens_of

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("bounds", "k", "rank", "tokens"),
    [
        ([(0, 4096), (4096, 5120), (5120, 6144)], 4096, 16, 64),
        ([(0, 14336), (14336, 28672)], 4096, 64, 300),
        ([(0, 4096)], 14336, 8, 5),
        ([(0, 4096), (4096, 5120), (5120, 6144)], 4096, 16, 2048),  # a prefill's tiles
    ],
)
def test_triton_lora_kernels_match_the_torch_path(dtype, bounds, k, rank, tokens):
    from stator.engines.native.kernels.lora import lora_expand, lora_shrink

    torch.manual_seed(0)
    slots_n, n = 8, bounds[-1][1]
    a = (torch.randn(slots_n, len(bounds) * rank, k, device="cuda") * 0.02).to(dtype)
    b = (torch.randn(slots_n, n, rank, device="cuda") * 0.02).to(dtype)
    slots = [(-1 if i % 5 == 0 else i % slots_n) for i in range(tokens)]
    x = torch.randn(tokens, k, device="cuda").to(dtype)
    y = torch.randn(tokens, n, device="cuda").to(dtype)
    batch = build_lora_batch(slots, slots_n, torch.device("cuda"), groups=True)
    # Reference in float32 from the same (rounded) operands.
    layer32 = LoraLayer(a.float(), b.float(), bounds, rank)
    ref = layer32._apply_torch(x.float(), y.float().clone(), batch)
    out = y.clone()
    lora_expand(lora_shrink(x, a, batch), b, out, batch, bounds, rank)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    err = float((out.float() - ref).abs().max() / ref.abs().max())
    assert err < tol, err
    untouched = [i for i, s in enumerate(slots) if s < 0]
    assert torch.equal(out[untouched], y[untouched])


def test_mixed_adapter_decode_on_cuda_matches_the_cpu_engine(llama, tmp_path):
    model_dir, _ = llama
    config = json.loads((model_dir / "config.json").read_text())
    paths = [
        write_random_adapter(
            tmp_path / f"a{i}", config, rank=8, seed=i, scale=0.1, dtype=torch.float32
        )
        for i in range(3)
    ]
    requests = []
    for i in range(12):
        req = greedy_request(f"r{i}", prompt(60 + i, 9 + i), 16)
        req.lora_name = [None, "a0", "a1", "a2"][i % 4]
        requests.append(req)

    def outputs(**overrides):
        core = core_for(model_dir, enable_lora=True, max_loras=2, max_num_seqs=16, **overrides)
        for i, path in enumerate(paths):
            adapter = load_adapter(f"a{i}", path, core.runner.model, 16, core.runner.dtype)
            core.add_adapter(adapter)
        outs = run_all(core, requests)
        return {rid: tokens_of(o) for rid, o in outs.items()}, core

    cpu, _ = outputs()
    gpu, core = outputs(device="cuda", kv_cache_memory="64MiB")
    assert core.runner.graphs is not None  # decode steps replayed graphs with LoRA
    assert gpu == cpu


def test_sleep_frees_device_memory_and_wake_restores_outputs(llama):
    model_dir, _ = llama
    core = core_for(
        model_dir, device="cuda", kv_cache_memory="256MiB", enable_sleep_mode=True, max_num_seqs=16
    )
    ids = prompt(3, 20)
    before = tokens_of(run_all(core, [greedy_request("a", ids, 12)])["a"])
    torch.cuda.synchronize()
    awake = torch.cuda.memory_allocated()
    for level in (1, 2):
        core.sleep(level)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() < 0.05 * awake
        core.wake()
        after = tokens_of(run_all(core, [greedy_request(f"b{level}", ids, 12)])[f"b{level}"])
        assert after == before
