"""Copying blocks between pools (`stator.kv.transfer.copy`): every method moves exactly the
named blocks and nothing else, on the CPU and (marked gpu) on one or two GPUs."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch

from stator.kv.block_copy import pool_shape
from stator.kv.transfer import copy as kv_copy
from stator.kv.transfer.config import COPIES, TransferConfig
from stator.kv.transfer.copy import copy_blocks, paired_runs


def _pools(src_blocks=60, dst_blocks=50, device="cpu", dst_device=None, dim=8):
    src = torch.randn(pool_shape(3, src_blocks, 4, 2, dim), device=device)
    dst = torch.zeros(pool_shape(3, dst_blocks, 4, 2, dim), device=dst_device or device)
    return src, dst


def _ids(pattern: str, n: int, src_blocks: int, dst_blocks: int, seed: int = 0):
    rng = random.Random(seed)
    if pattern == "consecutive":
        return list(range(3, 3 + n)), list(range(1, 1 + n))
    if pattern == "scattered":
        return rng.sample(range(src_blocks), n), rng.sample(range(dst_blocks), n)
    # churned: short runs of consecutive ids, as a cache that has served a while hands out
    # (n must be at most twice the number of 4-block groups)
    remote, local = [], []
    free_r, free_l = list(range(0, src_blocks - 3, 4)), list(range(0, dst_blocks - 3, 4))
    rng.shuffle(free_r)
    rng.shuffle(free_l)
    while len(remote) < n:
        r, lo, k = free_r.pop(), free_l.pop(), rng.randint(2, 4)
        remote += range(r, r + k)
        local += range(lo, lo + k)
    return remote[:n], local[:n]


def _check(src, dst, remote, local):
    assert torch.equal(dst[:, :, local].cpu(), src[:, :, remote].cpu())
    untouched = [b for b in range(dst.shape[2]) if b not in set(local)]
    assert not dst[:, :, untouched].any()


def test_paired_runs_split_where_either_side_breaks():
    assert paired_runs([4, 5, 6, 9, 10], [0, 1, 5, 6, 7]) == [(4, 0, 2), (6, 5, 1), (9, 6, 2)]
    assert paired_runs([], []) == []


@pytest.mark.parametrize("pattern", ["consecutive", "scattered", "churned"])
@pytest.mark.parametrize("method", COPIES)
def test_every_method_on_cpu_pools_copies_exactly_the_named_blocks(pattern, method):
    # CPU pools take the torch path whatever the method names (the others need CUDA).
    src, dst = _pools()
    remote, local = _ids(pattern, 20, 60, 50)
    moved = copy_blocks(src, dst, remote, local, method)
    assert moved == 20 * src[:, :, 0].numel() * src.element_size()
    _check(src, dst, remote, local)


def test_bad_arguments_are_refused():
    src, dst = _pools()
    with pytest.raises(ValueError, match="unknown copy method"):
        copy_blocks(src, dst, [1], [1], "fast")
    with pytest.raises(ValueError, match="2 remote blocks for 1"):
        copy_blocks(src, dst, [1, 2], [1])
    other = torch.zeros(pool_shape(3, 50, 4, 2, 4))
    with pytest.raises(ValueError, match="layouts differ"):
        copy_blocks(src, other, [1], [1])
    assert copy_blocks(src, dst, [], []) == 0
    with pytest.raises(ValueError, match="kv transfer copy"):
        TransferConfig(copy="fast").validate()


_KERNEL_CHECK = """
import random, torch
from stator.kv.block_copy import pool_shape
from stator.kv.transfer.kernel import copy_blocks_kernel, copy_counted, supported
rng = random.Random(0)
for dtype, dim in ((torch.bfloat16, 8), (torch.float32, 8), (torch.bfloat16, 1024)):
    src = torch.randn(pool_shape(3, 20, 4, 2, dim)).to(dtype)
    dst = torch.zeros(pool_shape(3, 12, 4, 2, dim), dtype=dtype)
    assert supported(src, dst)
    remote, local = rng.sample(range(20), 7), rng.sample(range(12), 7)
    copy_blocks_kernel(src, dst, remote, local)
    assert torch.equal(dst[:, :, local], src[:, :, remote])
    assert not dst[:, :, [b for b in range(12) if b not in local]].any()
assert not supported(torch.zeros(pool_shape(2, 4, 1, 1, 3)), torch.zeros(pool_shape(2, 4, 1, 1, 3)))
# Counted (the CUDA-graph launch): 16 programs' rows, 5 pairs named; the rest do nothing.
src = torch.randn(pool_shape(3, 20, 4, 2, 8)).to(torch.bfloat16)
dst = torch.zeros(pool_shape(3, 12, 4, 2, 8), dtype=torch.bfloat16)
remote, local = rng.sample(range(20), 5), rng.sample(range(12), 5)
ids = torch.zeros(1 + 2 * 16, dtype=torch.int32)
ids[0] = 5
ids[1 : 1 + 5] = torch.tensor(remote)
ids[17 : 17 + 5] = torch.tensor(local)  # the padding pairs (0 -> 0) must stay uncopied
copy_counted(src, dst, ids, 16)
assert torch.equal(dst[:, :, local], src[:, :, remote])
assert not dst[:, :, [b for b in range(12) if b not in local]].any()
print("ok")
"""


def test_copy_kernel_in_the_triton_interpreter():
    """The GPU kernel, run by Triton's interpreter on the CPU (where Triton is installed):
    bf16 and fp32, a slice larger than one program's share."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _KERNEL_CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pattern", ["consecutive", "scattered", "churned"])
@pytest.mark.parametrize("method", COPIES)
def test_every_method_on_gpus(pattern, method):
    second = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"
    for dst_device in ("cuda:0", second):
        src, dst = _pools(200, 150, "cuda:0", dst_device, dim=64)
        src, dst = src.to(torch.bfloat16), dst.to(torch.bfloat16)
        remote, local = _ids(pattern, 60, 200, 150)
        with torch.cuda.device(dst.device):
            copy_blocks(src, dst, remote, local, method)
            torch.cuda.current_stream(dst.device).synchronize()
        assert kv_copy._kernel_failed is None
        _check(src, dst, remote, local)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("graphs", [False, True])
def test_peer_copier_copies_exactly_the_named_blocks_for_any_count(graphs):
    from stator.kv.transfer.peer_copier import PeerCopier, bucket

    second = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"
    src, dst = _pools(200, 150, "cuda:0", second, dim=64)
    src, dst = src.to(torch.bfloat16), dst.to(torch.bfloat16)
    copier = PeerCopier(src, dst, torch.cuda.Stream(dst.device), graphs=graphs)
    rng = random.Random(1)
    # Counts inside one bucket, across buckets, and past the first capacity (regrowth).
    for n in (40, 3, 17, 64, 100, 1):
        remote, local = rng.sample(range(200), n), rng.sample(range(150), n)
        dst.zero_()
        copier.launch(remote, local)[1].synchronize()
        _check(src, dst, remote, local)
    assert copier.graphs is graphs and bucket(100) == 128 and bucket(3) == 16
    # More pulls in flight than pinned id slots (a burst): each still copies its own ids.
    dst.zero_()
    local_ids = rng.sample(range(150), 120)
    pulls = [(rng.sample(range(200), 5), local_ids[5 * i : 5 * i + 5]) for i in range(24)]
    for remote, local in pulls:
        copier.launch(remote, local)
    torch.cuda.synchronize(dst.device)
    for remote, local in pulls:
        assert torch.equal(dst[:, :, local].cpu(), src[:, :, remote].cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_coalesced_pulls_copy_each_ones_blocks_in_one_launch():
    import asyncio

    from stator.kv.transfer.coalesced import copy_batcher
    from stator.kv.transfer.peer_copier import PeerCopier

    second = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"
    src, dst = _pools(400, 300, "cuda:0", second, dim=64)
    src, dst = src.to(torch.bfloat16), dst.to(torch.bfloat16)
    copier = PeerCopier(src, dst, torch.cuda.Stream(dst.device))
    batcher = copy_batcher(copier, enabled=True)
    rng = random.Random(2)
    local_ids = rng.sample(range(300), 240)
    pulls = [(rng.sample(range(400), 40), local_ids[40 * i : 40 * i + 40]) for i in range(6)]
    results = await asyncio.gather(*(batcher.submit(p) for p in pulls))
    # The first starts alone at once; the five pending behind it are one launch.
    assert batcher.batches == 2 and [batch.size for _, batch in results] == [1] + [5] * 5
    assert all(phases["device"] > 0 for phases, _ in results)
    torch.cuda.synchronize(dst.device)
    for remote, local in pulls:
        assert torch.equal(dst[:, :, local].cpu(), src[:, :, remote].cpu())
    untouched = sorted(set(range(300)) - set(local_ids))
    assert not dst[:, :, untouched].any()
    # A pull cancelled while its batch copies raises only once the copy is over (the
    # prefill pin is released after that): the copier's stream is idle by then.
    for _ in range(3):
        tasks = [asyncio.ensure_future(batcher.submit(p)) for p in pulls]
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # both batches are launched (the first alone)
        tasks[3].cancel()
        try:
            await tasks[3]
        except asyncio.CancelledError:
            assert copier.stream.query()
        await asyncio.gather(*tasks[:3], *tasks[4:])
