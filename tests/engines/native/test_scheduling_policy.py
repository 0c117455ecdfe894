"""`--scheduling-policy lof` (longest output first): admission order, the bound on how
long a short request waits behind later long ones, and that order never changes tokens."""

from __future__ import annotations

import pytest

from stator.cli import run as run_cli
from stator.cli import worker as worker_cli
from stator.cli.worker import build_engine_config, load_engine_spec
from stator.engines.native.block_manager import BlockManager
from stator.engines.native.request import SamplingSpec, Sequence
from stator.engines.native.scheduler import Scheduler
from tests.engines.native.models import core_for, greedy_request, prompt, run_all, tokens_of


def seq(rid: str, max_tokens: int, prompt_len: int = 4) -> Sequence:
    return Sequence(
        rid, list(range(prompt_len)), prompt_len, SamplingSpec(max_tokens=max_tokens), 10_000
    )


def make(policy: str = "lof", **kw) -> Scheduler:
    kw.setdefault("max_num_seqs", 2)
    kw.setdefault("max_num_batched_tokens", 64)
    return Scheduler(BlockManager(100, 4), policy=policy, **kw)


def admitted(sched: Scheduler) -> list[str]:
    return [s.request_id for s, n in zip(*_batch(sched), strict=True) if n > 1]


def _batch(sched: Scheduler):
    batch = sched.schedule()
    for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        s.num_computed_tokens += n
        if s.num_computed_tokens == s.num_tokens:
            s.token_ids.append(7)
    return batch.seqs, batch.num_new_tokens


def finish(sched: Scheduler, rids: list[str]) -> None:
    for s in list(sched.running):
        if s.request_id in rids:
            sched.remove(s)


@pytest.mark.parametrize(
    ("policy", "order"),
    [("lof", ["b", "d", "c", "a", "e"]), ("fcfs", ["a", "b", "c", "d", "e"])],
)
def test_longest_output_first_ties_by_arrival(policy, order):
    sched = make(policy)
    for rid, max_tokens in zip("abcde", (5, 50, 20, 50, 1), strict=True):
        sched.add(seq(rid, max_tokens))
    got: list[str] = []
    while len(got) < 5:
        new = admitted(sched)
        got += new
        finish(sched, new)  # free both slots for the next two
    assert got == order


def test_a_batch_that_arrived_together_is_ordered_by_length_alone():
    """Overtaking counts only later arrivals: 3 x max_num_seqs requests queued in one step
    keep the length order to the last, whatever max_overtakes is."""
    sched = make(max_num_seqs=2, max_overtakes=1)
    lengths = [1, 9, 2, 8, 3, 7, 4, 6, 5, 10]
    for n in lengths:
        sched.add(seq(f"r{n}", n))
    got: list[str] = []
    while len(got) < len(lengths):
        new = admitted(sched)
        got += new
        finish(sched, new)
    assert got == [f"r{n}" for n in sorted(lengths, reverse=True)]


@pytest.mark.parametrize("bound", [1, 3, 0])
def test_a_short_request_is_passed_by_at_most_max_overtakes_later_arrivals(bound):
    """One slot; a short request waits while a long one arrives every step: it is admitted
    once `bound` later ones have passed it (0: max_num_seqs, here 1)."""
    sched = make(max_num_seqs=1, max_overtakes=bound)
    sched.add(seq("first", 100))
    assert admitted(sched) == ["first"]
    sched.add(seq("short", 2))
    assert admitted(sched) == []  # the slot is taken: short waits a step
    passed = 0
    for i in range(20):
        sched.add(seq(f"long{i}", 100))
        finish(sched, [s.request_id for s in sched.running])
        new = admitted(sched)
        if new == ["short"]:
            break
        assert new == [f"long{i}"]
        passed += 1
    assert passed == (bound or 1)
    assert [s.request_id for s in sched.waiting] == [f"long{passed}"]


def test_preempted_sequences_go_first_under_lof():
    sched = make(max_num_seqs=3)
    sched.add(seq("short", 2))
    assert admitted(sched) == ["short"]
    sched.add(seq("long", 90))
    victim = sched.running.pop()
    sched._preempt(victim)  # the engine preempts when blocks run short
    assert [s.request_id for s in sched.waiting] == ["short", "long"]
    assert admitted(sched)[0] == "short"


@pytest.mark.parametrize("command", ["run", "worker"])
def test_the_flag_and_its_env_twin_on_run_and_worker(command, monkeypatch):
    spec = load_engine_spec("native")

    def parse(*argv: str):
        parser = (run_cli if command == "run" else worker_cli).full_parser(spec)
        return build_engine_config(spec, parser.parse_args(["--engine", "native", *argv]))

    assert parse().scheduling_policy == "fcfs"
    assert parse("--scheduling-policy", "lof").scheduling_policy == "lof"
    monkeypatch.setenv("STATOR_SCHEDULING_POLICY", "lof")
    assert parse().scheduling_policy == "lof"
    assert parse("--scheduling-policy", "fcfs").scheduling_policy == "fcfs"
    with pytest.raises(SystemExit):  # argparse: "invalid choice: 'priority'"
        parse("--scheduling-policy", "priority")
    monkeypatch.setenv("STATOR_SCHEDULING_POLICY", "LOFF")
    with pytest.raises(SystemExit, match=r"STATOR_SCHEDULING_POLICY: 'LOFF' \(choose from"):
        parse()


def test_a_bad_policy_is_refused_before_the_model_loads(llama):
    with pytest.raises(ValueError, match=r"--scheduling-policy.*STATOR_SCHEDULING_POLICY.*'sjf'"):
        make("sjf")
    with pytest.raises(ValueError, match="--scheduling-policy"):
        core_for(llama[0], scheduling_policy="sjf")


def _requests():
    return [
        greedy_request(f"q{i}", prompt(30 + i, 5 + 3 * i), max_tokens)
        for i, max_tokens in enumerate((3, 17, 6, 25, 1, 9))
    ]


def test_lof_changes_the_order_not_the_tokens(llama):
    model_dir, _ = llama
    fcfs = run_all(core_for(model_dir, max_num_seqs=2), _requests())
    core = core_for(model_dir, max_num_seqs=2, scheduling_policy="lof")
    order: list[str] = []
    for r in _requests():
        core.add_request(r)
    lof = {r.request_id: [] for r in _requests()}
    while core.has_work():
        for rid, out in core.step():
            if not lof[rid]:
                order.append(rid)
            lof[rid].append(out)
    assert order[:2] == ["q3", "q1"]  # 25 and 17 tokens first
    for rid, outs in fcfs.items():
        assert tokens_of(lof[rid]) == tokens_of(outs)
        assert len(tokens_of(outs)) == _requests()[int(rid[1:])].stop.max_tokens


def test_aborting_a_waiting_request_under_lof(llama):
    model_dir, _ = llama
    core = core_for(model_dir, max_num_seqs=1, scheduling_policy="lof")
    for r in _requests():
        core.add_request(r)
    core.step()  # q3 (the longest) runs, the rest wait
    assert [s.request_id for s in core.scheduler.running] == ["q3"]
    assert core.abort("q1")  # the next in line under lof
    assert not core.abort("q1")
    seen: dict[str, list[int]] = {}
    while core.has_work():
        for rid, out in core.step():
            seen.setdefault(rid, []).extend(out.token_ids)
    assert "q1" not in seen and set(seen) == {"q0", "q2", "q3", "q4", "q5"}
    assert core.blocks.num_used_blocks == 0 and not core.scheduler.waiting
