"""Continuous batching decisions alone (no model)."""

from __future__ import annotations

import pytest

from stator.engines.native.block_manager import BlockManager
from stator.engines.native.request import SamplingSpec, Sequence, Status
from stator.engines.native.scheduler import Scheduler


def seq(rid: str, n: int) -> Sequence:
    return Sequence(rid, list(range(1000 + n * 7, 1000 + n * 8)), n, SamplingSpec(), 10_000)


def advance(sched: Scheduler, batch, new_token: int = 5) -> None:
    """What the engine does after a step: count computed tokens, sample where complete."""
    for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        s.num_computed_tokens += n
        if s.num_computed_tokens == s.num_tokens:
            s.token_ids.append(new_token)


def make(blocks: int = 100, block_size: int = 4, **kw) -> Scheduler:
    kw.setdefault("max_num_seqs", 8)
    kw.setdefault("max_num_batched_tokens", 16)
    return Scheduler(BlockManager(blocks, block_size), **kw)


def test_budget_chunks_prefill_and_mixes_it_with_decode():
    sched = make()
    a, b = seq("a", 10), seq("b", 30)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert [(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens, strict=False)] == [
        ("a", 10),
        ("b", 6),
    ]
    advance(sched, batch)
    batch = sched.schedule()  # a decodes, b continues its prompt with the rest of the budget
    assert [(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens, strict=False)] == [
        ("a", 1),
        ("b", 15),
    ]
    assert batch.total_tokens == 16


def test_max_prefill_chunk_limits_each_prompt_chunk():
    sched = make(max_prefill_chunk=7)
    a = seq("a", 20)
    sched.add(a)
    chunks = []
    while a.num_computed_tokens < a.num_tokens - 1 or not chunks:
        batch = sched.schedule()
        chunks.append(batch.num_new_tokens[0])
        advance(sched, batch)
        if a.num_output_tokens:
            break
    assert chunks == [7, 7, 6]


def test_max_num_seqs_bounds_the_running_set():
    sched = make(max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(4):
        sched.add(seq(f"s{i}", 3))
    batch = sched.schedule()
    assert [s.request_id for s in batch.seqs] == ["s0", "s1"]
    assert len(sched.waiting) == 2


def test_admission_waits_for_free_blocks():
    sched = make(blocks=3, max_num_batched_tokens=100)
    sched.add(seq("a", 8))
    sched.add(seq("b", 8))
    batch = sched.schedule()
    assert [s.request_id for s in batch.seqs] == ["a"]
    assert [s.request_id for s in sched.waiting] == ["b"]


def test_preemption_frees_the_newest_and_requeues_it_first():
    sched = make(blocks=4, max_num_batched_tokens=100)
    a, b = seq("a", 8), seq("b", 7)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert len(batch.seqs) == 2  # 2 + 2 blocks: the pool is full
    advance(sched, batch)
    batch = sched.schedule()  # a's 9th token needs a third block: b is preempted
    assert batch.preempted == [b] and batch.seqs == [a]
    assert b.status is Status.WAITING and b.num_computed_tokens == 0 and b.block_ids == []
    assert sched.waiting[0] is b and sched.num_preemptions == 1


def test_a_lone_sequence_that_cannot_grow_preempts_itself():
    sched = make(blocks=2, max_num_batched_tokens=100)
    a = seq("a", 8)
    sched.add(a)
    advance(sched, sched.schedule())
    batch = sched.schedule()
    assert batch.preempted == [a] and not batch.seqs


def test_remove_frees_blocks_wherever_the_sequence_is():
    sched = make(blocks=10)
    a, b = seq("a", 8), seq("b", 8)
    sched.add(a)
    sched.add(b)
    sched.schedule()
    sched.remove(a)
    sched.remove(b)
    assert sched.blocks.num_used_blocks == 0 and not sched.has_work()
    c = seq("c", 4)
    sched.add(c)
    sched.remove(c)
    assert not sched.waiting


def test_a_retired_sequence_keeps_its_blocks_until_removed():
    """Overlap retires a sequence whose last token is still being computed."""
    sched = make()
    a, b = seq("a", 6), seq("b", 5)
    sched.add(a)
    sched.add(b)
    advance(sched, sched.schedule())
    held = list(a.block_ids)
    sched.retire(a)
    batch = sched.schedule()
    assert [s.request_id for s in batch.seqs] == ["b"]
    assert a.block_ids == held and sched.blocks.num_used_blocks == len(held) + len(b.block_ids)
    assert sched.has_work()
    sched.remove(a)
    assert a.block_ids == [] and a.status is Status.FINISHED


def ids(batch) -> list[tuple[str, int]]:
    return [(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)]


def test_continuous_decode_steps_group_new_prompts_into_one_step():
    sched = make(num_continuous_decode_steps=3, max_num_batched_tokens=64)
    a = seq("a", 4)
    sched.add(a)
    batch = sched.schedule()  # nothing runs: admitted at once
    assert ids(batch) == [("a", 4)]
    advance(sched, batch)
    b = seq("b", 4)
    sched.add(b)
    batch = sched.schedule()  # b waits: a decodes alone
    assert ids(batch) == [("a", 1)]
    advance(sched, batch)
    c = seq("c", 4)
    sched.add(c)
    batch = sched.schedule()
    assert ids(batch) == [("a", 1)]
    advance(sched, batch)
    batch = sched.schedule()  # b has waited 2 steps: b and c prefill together
    assert ids(batch) == [("a", 1), ("b", 4), ("c", 4)]
    advance(sched, batch)
    d = seq("d", 4)
    sched.add(d)
    assert ids(sched.schedule()) == [("a", 1), ("b", 1), ("c", 1)]


def test_one_continuous_decode_step_admits_every_step():
    sched = make(max_num_batched_tokens=64)
    a = seq("a", 4)
    sched.add(a)
    advance(sched, sched.schedule())
    sched.add(seq("b", 4))
    assert ids(sched.schedule()) == [("a", 1), ("b", 4)]


def test_continuous_decode_steps_keep_admitting_a_backlog_cut_by_the_budget():
    # Prompts that waited long enough but did not fit one step's budget go in the next.
    sched = make(num_continuous_decode_steps=4, max_num_batched_tokens=10)
    for name in "abc":
        sched.add(seq(name, 6))
    batch = sched.schedule()
    assert ids(batch) == [("a", 6), ("b", 4)]
    advance(sched, batch)
    batch = sched.schedule()
    assert ids(batch) == [("a", 1), ("b", 2), ("c", 6)]


def test_continuous_decode_steps_admit_at_once_while_nothing_decodes():
    # A prefill worker's steps: chunked prompts only, nothing to protect from a prefill.
    sched = make(num_continuous_decode_steps=4, max_num_batched_tokens=16)
    sched.add(seq("a", 20))
    advance(sched, sched.schedule())
    sched.add(seq("b", 4))
    assert ids(sched.schedule()) == [("a", 4), ("b", 4)]


@pytest.mark.parametrize("steps", [0, -1])
def test_continuous_decode_steps_must_be_positive(steps):
    with pytest.raises(ValueError, match="num-continuous-decode-steps"):
        make(num_continuous_decode_steps=steps)


def test_continuous_decode_steps_gate_arrivals_again_once_the_backlog_is_in():
    sched = make(num_continuous_decode_steps=4, max_num_batched_tokens=10)
    for name in "ab":
        sched.add(seq(name, 6))
    advance(sched, sched.schedule())
    batch = sched.schedule()  # b's rest: the queue is empty again
    assert ids(batch) == [("a", 1), ("b", 2)]
    advance(sched, batch)
    sched.add(seq("c", 6))
    assert ids(sched.schedule()) == [("a", 1), ("b", 1)]
