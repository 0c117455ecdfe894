"""KV tiers in the engine: blocks evicted from the (CPU build's) device cache come back from
host memory and disk, and the outputs are those of an engine that recomputed them."""

from __future__ import annotations

import pytest
import torch

from stator.kv.block_copy import block_bytes
from stator.kv.hashing import block_hashes
from tests.engines.native.models import core_for, greedy_request, prompt, run_all, tokens_of

GiB = 1 << 30
GPU_BLOCKS = 8  # 128 tokens: two long prompts cannot both stay cached


def _core(model_dir, host_blocks=0, disk_blocks=0, disk_dir=None, **kw):
    per_block = core_for(model_dir, kv_cache_memory="64KiB").runner.bytes_per_block()
    return core_for(
        model_dir,
        kv_cache_memory=str(GPU_BLOCKS * per_block),
        kv_offloading_size=host_blocks * per_block / GiB,
        disk_offload_dir=str(disk_dir or ""),
        disk_offload_gb=disk_blocks * per_block / GiB,
        kv_load_policy="always",
        **kw,
    )


def _turns(core, first, second):
    """Run `first`, then `second` (which evicts it), then `first` again with more tokens."""
    outs = {}
    outs.update(run_all(core, [greedy_request("a1", first, 8)]))
    outs.update(run_all(core, [greedy_request("b", second, 8)]))
    outs.update(run_all(core, [greedy_request("a2", [*first, 7, 8, 9], 8)]))
    return outs


@pytest.fixture(scope="module")
def reference(llama):
    model_dir, _ = llama
    core = _core(model_dir)
    assert core.offload is None
    return _turns(core, prompt(1, 70), prompt(2, 90))


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_host_tier_hit_gives_the_same_tokens(llama, reference, overlap):
    model_dir, _ = llama
    core = _core(model_dir, host_blocks=16, overlap=overlap)
    outs = _turns(core, prompt(1, 70), prompt(2, 90))
    for rid in ("a1", "b", "a2"):
        assert tokens_of(outs[rid]) == tokens_of(reference[rid]), rid
    stats = core.offload.stats
    assert stats.hits["host"] >= 2  # some of a2's first 4 blocks came back from host
    assert outs["a2"][0].cached_tokens >= 64
    assert reference["a2"][0].cached_tokens < 64
    assert core.blocks.num_used_blocks == 0  # load references released
    core.close()


def test_disk_tier_hit_gives_the_same_tokens(llama, reference, tmp_path):
    model_dir, _ = llama
    core = _core(model_dir, host_blocks=2, disk_blocks=64, disk_dir=tmp_path)
    outs = _turns(core, prompt(1, 70), prompt(2, 90))
    for rid in ("a1", "b", "a2"):
        assert tokens_of(outs[rid]) == tokens_of(reference[rid]), rid
    assert core.offload.stats.hits["disk"] >= 2
    # Loads stage through host memory: at most its 2 slots' worth come back at once.
    assert outs["a2"][0].cached_tokens >= 48
    core.close()
    assert not list(tmp_path.glob("*.tmp"))


def test_disk_tier_survives_a_restart(llama, reference, tmp_path):
    model_dir, _ = llama
    first, second = prompt(1, 70), prompt(2, 90)
    core = _core(model_dir, host_blocks=2, disk_blocks=64, disk_dir=tmp_path)
    run_all(core, [greedy_request("a1", first, 8)])
    run_all(core, [greedy_request("b", second, 8)])
    run_all(core, [greedy_request("c", prompt(3, 100), 4)])  # push the rest down too
    core.close()  # writes what the host tier holds to disk too
    on_disk = set(core.offload.disk.hashes())
    assert set(block_hashes(first[:64], 16)) <= on_disk

    again = _core(model_dir, host_blocks=2, disk_blocks=64, disk_dir=tmp_path)
    assert set(again.offload.disk.hashes()) == on_disk
    announced = {
        h
        for e in again.kv_state()
        if getattr(e.data, "tier", "") == "disk"
        for h in e.data.block_hashes
    }
    assert announced == on_disk
    outs = run_all(again, [greedy_request("a2", [*first, 7, 8, 9], 8)])
    assert tokens_of(outs["a2"]) == tokens_of(reference["a2"])
    assert again.offload.stats.hits["disk"] >= 2  # as many as the 2 host slots stage
    again.close()


def test_disk_tier_of_another_model_is_dropped(llama, tmp_path):
    model_dir, _ = llama
    core = _core(model_dir, host_blocks=2, disk_blocks=64, disk_dir=tmp_path)
    run_all(core, [greedy_request("a", prompt(1, 70), 4), greedy_request("b", prompt(2, 90), 4)])
    run_all(core, [greedy_request("c", prompt(3, 100), 4)])
    core.offload.disk.flush()
    assert list(tmp_path.glob("*.kv"))
    core.close()
    (tmp_path / "layout.json").write_text('{"model": "another"}')
    again = _core(model_dir, host_blocks=2, disk_blocks=64, disk_dir=tmp_path)
    assert len(again.offload.disk) == 0 and not list(tmp_path.glob("*.kv"))
    again.close()


def test_tiers_stay_within_their_budgets(llama, tmp_path):
    model_dir, _ = llama
    core = _core(model_dir, host_blocks=3, disk_blocks=5, disk_dir=tmp_path)
    for i in range(6):
        run_all(core, [greedy_request(f"r{i}", prompt(10 + i, 100), 4)])
    offload = core.offload
    offload.disk.flush()
    assert len(offload.host) <= 3
    assert len(offload.disk) <= 5
    files = list(tmp_path.glob("*.kv"))
    assert len(files) == len(offload.disk)
    size = block_bytes(core.runner.kv_pool)
    assert all(f.stat().st_size > size for f in files)
    events = [e.data for e in core.drain_kv_events()]
    tiers = {getattr(d, "tier", None) for d in events}
    assert {"gpu", "host", "disk"} <= tiers
    core.close()
    assert offload.host.buffer.numel() == 0


def test_offload_flags_are_checked(llama, tmp_path):
    model_dir, _ = llama
    with pytest.raises(ValueError, match="prefix caching"):
        _core(model_dir, host_blocks=4, enable_prefix_caching=False)
    with pytest.raises(ValueError, match="disk-offload-gb"):
        _core(model_dir, host_blocks=4, disk_dir=tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("policy", ["always", "auto"])
def test_cuda_host_tier_gives_the_same_tokens(llama, policy):
    model_dir, _ = llama
    cuda = {"device": "cuda", "dtype": "bfloat16", "overlap": "on"}
    per_block = core_for(model_dir, **cuda, kv_cache_memory="1MiB").runner.bytes_per_block()
    plain = core_for(model_dir, **cuda, kv_cache_memory=str(GPU_BLOCKS * per_block))
    expected = _turns(plain, prompt(1, 70), prompt(2, 90))
    core = core_for(
        model_dir,
        **cuda,
        kv_cache_memory=str(GPU_BLOCKS * per_block),
        kv_offloading_size=16 * per_block / GiB,
        kv_load_policy=policy,
    )
    outs = _turns(core, prompt(1, 70), prompt(2, 90))
    for rid in ("a1", "b", "a2"):
        assert tokens_of(outs[rid]) == tokens_of(expected[rid]), rid
    if policy == "always":
        assert core.offload.stats.hits["host"] >= 2
        assert outs["a2"][0].cached_tokens >= 64
    assert core.offload.host.buffer.is_pinned()
    core.offload.settle()
    assert core.offload.poll() == [] and not core.offload._inflight
    assert core.blocks.num_used_blocks == 0
    core.close()


def test_abort_while_loading_gives_the_blocks_back(llama):
    model_dir, _ = llama
    core = _core(model_dir, host_blocks=16, overlap="on")
    first = prompt(1, 70)
    run_all(core, [greedy_request("a1", first, 8)])
    run_all(core, [greedy_request("b", prompt(2, 90), 8)])
    core.add_request(greedy_request("a2", [*first, 7, 8, 9], 8))
    core.step()  # admitted with its prefix loading; computes from the next step
    assert core.offload.stats.hits["host"] >= 2
    core.abort("a2")
    while core.has_work():
        core.step()
    assert core.blocks.num_used_blocks == 0
    core.close()
