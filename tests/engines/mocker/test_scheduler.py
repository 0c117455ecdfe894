from stator.engines.mocker.block_manager import BlockManager
from stator.engines.mocker.scheduler import Scheduler, Sequence
from stator.kv.hashing import block_hashes

BS = 4


def make(num_blocks=64, **kw) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BS), **kw)


def seq(rid: str, n: int, start: int = 0) -> Sequence:
    tokens = list(range(start, start + n))
    return Sequence(rid, tokens, n)


def run_step(s: Scheduler, token: int = 7) -> list[Sequence]:
    """Schedule and complete one step, appending `token` to every sequence that is ready."""
    step = s.schedule()
    ready = s.complete(step)
    for q in ready:
        s.append_token(q, token)
    return ready


def test_decode_first_then_prefill_within_budget():
    s = make(max_num_batched_tokens=10)
    a = seq("a", 6)
    s.add(a)
    assert run_step(s) == [a]  # a's whole prompt fits
    b = seq("b", 20, start=100)
    s.add(b)
    step = s.schedule()
    assert [(q.request_id, n) for q, n in step.work] == [("a", 1), ("b", 9)]
    assert step.num_decode == 1 and step.prefill_tokens == 9
    assert step.decode_context == 7


def test_chunked_prefill_splits_a_long_prompt():
    s = make(max_num_batched_tokens=8)
    a = seq("a", 20)
    s.add(a)
    chunks = []
    for _ in range(3):
        step = s.schedule()
        chunks.append(step.work[0][1])
        s.complete(step)
    assert chunks == [8, 8, 4]
    assert a.num_computed == 20


def test_without_chunked_prefill_a_prompt_over_budget_waits():
    s = make(max_num_batched_tokens=8, enable_chunked_prefill=False)
    s.add(seq("a", 20))
    assert s.schedule().empty
    s2 = make(max_num_batched_tokens=8, enable_chunked_prefill=False)
    s2.add(seq("a", 6))
    s2.add(seq("b", 6, start=50))
    step = s2.schedule()
    assert [q.request_id for q, _ in step.work] == ["a"]  # b would need chunking


def test_max_num_seqs_limits_running():
    s = make(max_num_seqs=2)
    for i in range(3):
        s.add(seq(f"r{i}", 4, start=10 * i))
    run_step(s)
    assert [q.request_id for q in s.running] == ["r0", "r1"]
    assert [q.request_id for q in s.waiting] == ["r2"]


def test_admission_needs_free_blocks():
    s = make(num_blocks=4)
    s.add(seq("a", 12))  # 3 blocks, plus room to grow into the 4th
    s.add(seq("b", 8, start=50))  # 2 blocks: does not fit beside a
    step = s.schedule()
    assert [q.request_id for q, _ in step.work] == ["a"]
    assert [q.request_id for q in s.waiting] == ["b"]


def test_cached_prefix_is_skipped_and_counted():
    s = make()
    a = seq("a", 10)
    s.add(a)
    run_step(s)
    s.finish(a)
    b = Sequence("b", [*range(10), 99, 98], 12)
    s.add(b)
    step = s.schedule()
    assert b.num_cached == 8  # two full blocks of a's prompt
    assert step.work == [(b, 4)] and step.prefill_tokens == 4


def test_fully_cached_prompt_still_computes_its_last_token():
    s = make()
    a = seq("a", 8)
    s.add(a)
    run_step(s)
    s.finish(a)
    b = seq("b", 8)
    s.add(b)
    step = s.schedule()
    assert b.num_cached == 4 and step.work == [(b, 4)]


def test_decode_out_of_blocks_preempts_newest_and_recomputes():
    s = make(num_blocks=4)
    a = seq("a", 8)
    b = seq("b", 8, start=50)
    s.add(a)
    s.add(b)
    assert run_step(s) == [a, b]  # 4 blocks, all in use; both need a 5th token
    step = s.schedule()
    assert step.preempted == [b]
    assert [q for q, _ in step.work] == [a]
    assert b.num_computed == 0 and b.num_held_full == 0 and list(s.waiting) == [b]
    assert b.tokens[-1] == 7  # its generated token is kept for the recompute
    s.complete(step)
    s.finish(a)
    step = s.schedule()  # b comes back: its prefix is still cached
    assert step.work == [(b, 5)]
    assert b.num_cached == 0  # counted at first admission only
    assert s.num_preemptions == 1


def test_abort_frees_blocks_at_once():
    s = make(num_blocks=8)
    a = seq("a", 10)
    s.add(a)
    run_step(s)
    assert s.blocks.num_active_blocks == 3
    s.abort(a)
    assert s.blocks.num_active_blocks == 0 and not s.running
    w = seq("w", 4)
    s.add(w)
    s.abort(w)
    assert not s.waiting and not s.has_work


def test_abort_during_a_step_skips_the_sequence():
    s = make()
    a = seq("a", 6)
    s.add(a)
    step = s.schedule()
    s.abort(a)
    assert s.complete(step) == []
    assert s.blocks.num_active_blocks == 0


def test_generated_blocks_are_cached_as_they_fill():
    s = make()
    a = seq("a", 4)
    s.add(a)
    for _ in range(5):
        run_step(s, token=3)
    assert a.tokens == [0, 1, 2, 3, 3, 3, 3, 3, 3]
    assert a.num_held_full == 2  # 8 computed tokens
    (stored,) = [e.data for e in s.blocks.drain_events()]  # one chain: one event
    assert stored.block_hashes == block_hashes(a.tokens[:8], BS)
    assert stored.token_ids == [0, 1, 2, 3, 3, 3, 3, 3]


def test_remote_prefill_tokens_are_not_computed_again():
    s = make()
    b = Sequence("b", list(range(9)), 9, num_remote=9)
    s.add(b)
    step = s.schedule()
    assert step.work == [(b, 1)]
    assert b.num_held_full == 2  # the pulled KV is cached locally


def test_same_step_admissions_share_blocks_being_computed():
    s = make()
    a = seq("a", 10)
    b = seq("b", 10)
    s.add(a)
    s.add(b)
    step = s.schedule()
    assert b.num_cached == 8
    assert step.work == [(a, 10), (b, 2)]
    assert s.blocks.refcount(a.block_hashes[0]) == 2
