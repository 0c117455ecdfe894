"""LoRA adapters in the native engine against PEFT's merged models (float32, CPU)."""

from __future__ import annotations

import random

import pytest
import torch

from stator.engines.base import EngineError
from stator.engines.native.lora.adapter import load_adapter
from stator.engines.native.lora.batch import (
    SHARED_SCRATCH,
    TILE_M,
    build_lora_batch,
    max_tiles,
)
from stator.engines.native.lora.graph_inputs import LoraGraphInputs
from stator.engines.native.request import SamplingSpec, Sequence
from stator.protocols import BlockStored
from tests.engines.native.lora_adapters import build_adapter
from tests.engines.native.models import (
    core_for,
    greedy_request,
    hf_greedy,
    prompt,
    run_all,
    tokens_of,
)
from tests.engines.native.test_models import relative_error
from tests.engines.native.triton_interpreter import run_interpreted

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def adapters(llama, tmp_path_factory):
    """name -> (adapter dir, merged reference model)."""
    _, hf = llama
    root = tmp_path_factory.mktemp("loras")
    return {
        "full": build_adapter(hf, root / "full", seed=1),
        # Some projections only, another rank, rsLoRA scaling, a per-module rank.
        "partial": build_adapter(
            hf,
            root / "partial",
            seed=2,
            r=4,
            lora_alpha=8,
            use_rslora=True,
            target_modules=["q_proj", "v_proj", "down_proj"],
            rank_pattern={"down_proj": 2},
        ),
        "third": build_adapter(hf, root / "third", seed=3, r=16, lora_alpha=4),
    }


def lora_core(model_dir, adapters, names, **overrides):
    core = core_for(model_dir, enable_lora=True, **overrides)
    for name in names:
        path, _ = adapters[name]
        core.add_adapter(load_adapter(name, path, core.runner.model, 16, core.runner.dtype))
    return core


def adapter_prompt_logits(core, ids, name):
    seq = Sequence("probe", list(ids), len(ids), SamplingSpec(), core.max_total_tokens)
    seq.lora = core.adapters[name] if name else None
    assert core.blocks.admit(seq, len(ids))
    slots = core.runner.lora_slots.slots_for([seq.lora]) if name else None
    inputs = core.runner.prepare([seq], [len(ids)], list(range(len(ids))), slots)
    logits = core.runner.execute(inputs)
    core.blocks.free(seq)
    return logits


@pytest.mark.parametrize("name", ["full", "partial", "third"])
def test_prompt_logits_match_peft_merged_model(llama, adapters, name):
    model_dir, _ = llama
    core = lora_core(model_dir, adapters, [name])
    ids = prompt(11, 40)
    with torch.no_grad():
        ref = adapters[name][1](torch.tensor([ids])).logits[0]
    assert relative_error(adapter_prompt_logits(core, ids, name), ref) < 1e-4
    # The adapter matters: the base model's logits are far from the merged model's.
    assert relative_error(adapter_prompt_logits(core, ids, None), ref) > 1e-2


def test_adapters_and_base_in_one_batch_decode_as_their_models(llama, adapters):
    model_dir, hf = llama
    core = lora_core(model_dir, adapters, ["full", "partial", "third"])
    cases = [("base", None, hf), *((n, n, adapters[n][1]) for n in ("full", "partial", "third"))]
    requests = []
    for i, (rid, lora, _) in enumerate(cases):
        req = greedy_request(rid, prompt(20 + i, 17 + 3 * i), 12)
        req.lora_name = lora
        requests.append(req)
    outs = run_all(core, requests)
    for (rid, _, model), req in zip(cases, requests, strict=True):
        assert tokens_of(outs[rid]) == hf_greedy(model, req.token_ids, 12), rid


def test_fewer_slots_than_adapters_still_serves_each_correctly(llama, adapters):
    model_dir, _ = llama
    core = lora_core(model_dir, adapters, ["full", "partial", "third"], max_loras=1)
    requests = []
    for i, name in enumerate(["full", "partial", "third", "full"]):
        req = greedy_request(f"r{i}", prompt(40 + i, 15), 6)
        req.lora_name = name
        requests.append(req)
    outs = run_all(core, requests)
    for req in requests:
        expected = hf_greedy(adapters[req.lora_name][1], req.token_ids, 6)
        assert tokens_of(outs[req.request_id]) == expected


def test_prefix_cache_never_mixes_adapters(llama, adapters):
    model_dir, _ = llama
    core = lora_core(model_dir, adapters, ["full", "partial"])
    ids = prompt(50, 40)
    first = greedy_request("a", ids, 2)
    first.lora_name = "full"
    run_all(core, [first])
    events = core.drain_kv_events()
    stored = [e.data for e in events if isinstance(e.data, BlockStored)]
    assert stored and all(d.lora_name == "full" for d in stored)
    other = greedy_request("b", ids, 2)
    other.lora_name = "partial"
    assert run_all(core, [other])["b"][0].cached_tokens == 0
    same = greedy_request("c", ids, 2)
    same.lora_name = "full"
    assert run_all(core, [same])["c"][0].cached_tokens == 32
    base = greedy_request("d", ids, 2)
    assert run_all(core, [base])["d"][0].cached_tokens == 0
    assert {e.data.lora_name for e in core.kv_state()} == {"full", "partial", None}


def test_unknown_adapter_and_lora_off_are_clear_errors(llama, adapters):
    model_dir, _ = llama
    req = greedy_request("x", prompt(1, 5), 2)
    req.lora_name = "nope"
    with pytest.raises(EngineError, match="not loaded"):
        lora_core(model_dir, adapters, []).add_request(req)
    with pytest.raises(EngineError, match="--enable-lora"):
        core_for(model_dir).add_request(req)


def test_adapters_the_engine_cannot_serve_are_refused(llama, adapters, tmp_path):
    model_dir, hf = llama
    core = core_for(model_dir, enable_lora=True, max_lora_rank=8)
    with pytest.raises(EngineError, match="max-lora-rank"):
        load_adapter("t", adapters["third"][0], core.runner.model, 8, torch.float32)
    head, _ = build_adapter(hf, tmp_path / "head", seed=4, target_modules=["lm_head"])
    with pytest.raises(EngineError, match="cannot serve"):
        load_adapter("h", head, core.runner.model, 8, torch.float32)
    dora, _ = build_adapter(hf, tmp_path / "dora", seed=5, use_dora=True)
    with pytest.raises(EngineError, match="DoRA"):
        load_adapter("d", dora, core.runner.model, 8, torch.float32)


def test_tensor_parallel_with_lora_is_refused(llama):
    model_dir, _ = llama
    with pytest.raises(ValueError, match="tensor parallelism"):
        core_for(model_dir, enable_lora=True, tensor_parallel_size=2)


def test_lora_batch_groups_tokens_by_slot():
    batch = build_lora_batch([1, -1, 0, 1, -1, 0], 3, torch.device("cpu"), groups=True)
    assert batch.sorted_idx.tolist() == [2, 5, 0, 3]
    assert batch.tiles.tolist() == [[0, 0, 2], [1, 2, 2]]  # (slot, start, count); slot 2 unused
    assert [(s, r.tolist()) for s, r in batch.groups] == [(0, [2, 5]), (1, [0, 3])]
    assert build_lora_batch([-1, -1], 3, torch.device("cpu"), groups=True) is None


def test_lora_tiles_hold_at_most_tile_m_tokens_and_never_exceed_max_tiles():
    slots = [0] * 40 + [-1] * 3 + [2] * 17 + [1]
    batch = build_lora_batch(slots, 3, torch.device("cpu"), groups=False)
    assert batch.tiles.tolist() == [
        [0, 0, 16], [0, 16, 16], [0, 32, 8], [1, 40, 1], [2, 41, 16], [2, 57, 1]
    ]  # fmt: skip
    rng = random.Random(0)
    for _ in range(300):
        tokens, num_slots = rng.randint(1, 200), rng.randint(1, 9)
        slots = [rng.randrange(-1, num_slots) for _ in range(tokens)]
        batch = build_lora_batch(slots, num_slots, torch.device("cpu"), groups=False)
        if batch is not None:
            assert batch.tiles.shape[0] <= max_tiles(tokens, num_slots)
    # The bound is reached: every slot with one token, the rest filling whole tiles.
    worst = [0] * 33 + [1, 2, 3]
    batch = build_lora_batch(worst, 4, torch.device("cpu"), groups=False)
    assert batch.tiles.shape[0] == max_tiles(len(worst), 4) == 4 + 32 // TILE_M


def test_a_step_makes_one_zeroed_lora_workspace_on_first_use_and_prefills_their_own():
    """Made by the first projection that asks (a step that replays a CUDA graph never
    asks, so it allocates none); steps over SHARED_SCRATCH tokens get one per call."""
    dev = torch.device("cpu")
    batch = build_lora_batch([0, -1, 1], 2, dev, groups=True, scratch_shape=(4, 48))
    assert batch.workspace is None
    h = batch.scratch(2, 32, dev)
    assert batch.workspace is not None and batch.workspace.shape == (4, 3, 48)
    assert h.shape == (3, 32) and h.data_ptr() == batch.workspace[2].data_ptr()
    assert not h.any()
    assert batch.scratch(3, 16, dev).data_ptr() == batch.workspace[3].data_ptr()
    long = build_lora_batch([0] * (SHARED_SCRATCH + 1), 2, dev, groups=True, scratch_shape=(4, 48))
    assert long.scratch(0, 16, dev).shape == (SHARED_SCRATCH + 1, 16)
    assert long.workspace is None


def test_graph_inputs_give_a_smaller_step_s_leftover_tiles_count_zero():
    inputs = LoraGraphInputs(64, 8, (2, 32), torch.device("cpu"))
    big = build_lora_batch(list(range(8)) * 8, 8, torch.device("cpu"), groups=False)
    inputs.load(big, 64)
    small = build_lora_batch([3, -1, 3], 8, torch.device("cpu"), groups=False)
    inputs.load(small, 4)
    captured = inputs.batch(4)
    assert captured.tiles.shape[0] == max_tiles(4, 8) == 4
    assert captured.tiles.tolist() == [[3, 0, 2], [0, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert captured.sorted_idx[:2].tolist() == [0, 2]
    assert captured.workspace is not None and captured.workspace.shape == (2, 4, 32)


_KERNEL_CHECK = """
import torch
from stator.engines.native.kernels import lora as kernels
from stator.engines.native.kernels.lora import lora_expand, lora_shrink
from stator.engines.native.lora.batch import build_lora_batch
from stator.engines.native.lora.graph_inputs import LoraGraphInputs
from stator.engines.native.lora.layer import LoraLayer

torch.manual_seed(0)
for slots_n, rank, bounds, k, tokens in [
    (3, 16, [(0, 64), (64, 96), (96, 128)], 96, 21),
    (2, 8, [(0, 48)], 200, 5),
    (2, 16, [(0, 32), (32, 64)], 300, 40),  # a slot with 3 tiles; 3 slabs of K
]:
    n = bounds[-1][1]
    layer = LoraLayer(
        torch.randn(slots_n, len(bounds) * rank, k), torch.randn(slots_n, n, rank), bounds, rank
    )
    slots = [(-1 if i % 4 == 0 else i % slots_n) for i in range(tokens)]
    if tokens == 40:
        slots = [0] * 35 + [-1, 1, 1, -1, 1]
    x, y = torch.randn(tokens, k), torch.randn(tokens, n)
    batch = build_lora_batch(slots, slots_n, torch.device("cpu"), groups=True)
    ref = layer._apply_torch(x, y.clone(), batch)
    # As a CUDA graph runs it: the tiles of a larger bucket, the unused ones of count 0
    # after a bigger step filled them.
    graph = LoraGraphInputs(tokens + 40, slots_n, (3, len(bounds) * rank + 8), torch.device("cpu"))
    graph.load(build_lora_batch([0] * (tokens + 40), slots_n, torch.device("cpu"), groups=False), tokens + 40)
    graph.load(batch, tokens + 40)
    padded = graph.batch(tokens + 40)
    padded.workspace = padded.workspace[:, :tokens]
    assert padded.tiles.shape[0] > batch.tiles.shape[0]
    runs = [(batch, None), (batch, torch.zeros(3, tokens, len(bounds) * rank + 8))]
    runs.append((padded, padded.workspace))
    # 1 program per tile: the whole of K in one program's loop, no split.
    for programs in (1024, 1):
        kernels._SHRINK_PROGRAMS = programs
        for run, workspace in runs:
            run.workspace = workspace if workspace is None else workspace.zero_()
            out = y.clone()
            lora_expand(lora_shrink(x, layer.a, run, 1), layer.b, out, run, bounds, rank)
            err = float((out - ref).abs().max() / ref.abs().max())
            assert err < 1e-5, err
            base = [i for i, s in enumerate(slots) if s < 0]
            assert torch.equal(out[base], y[base])
print("ok")
"""


def test_triton_lora_kernels_match_the_torch_path_in_the_interpreter():
    """The GPU kernels, run by Triton's interpreter on the CPU (where Triton is installed)."""
    run_interpreted(_KERNEL_CHECK, timeout=300)
