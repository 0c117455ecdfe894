import json

import pytest

from stator.engines.mocker.block_manager import BlockManager
from stator.engines.mocker.scheduler import Scheduler, Sequence
from stator.engines.mocker.timing import PolynomialTiming, ProfileTiming, StepShape, StepTimer


def shape(prefill=0, decode=0, context=0, total=1000) -> StepShape:
    return StepShape(prefill, decode, context, total)


def test_prefill_and_decode_polynomials():
    model = PolynomialTiming()
    assert model.prefill_ms(shape(prefill=512)) == pytest.approx(
        4.209989e-7 * 512**2 + 1.518344e-2 * 512 + 16.50142
    )
    assert model.decode_ms(shape(decode=1, context=500)) == pytest.approx(
        -25.74 * 0.25 + 54.01 * 0.5 + 5.74
    )
    assert model.decode_ms(shape(decode=1, context=0)) == pytest.approx(5.74)


def test_decode_load_is_the_decoding_tokens_not_the_blocks_held():
    # Dynamo 1.6.1 measured: 8 sequences decoding from 65-token prompts in a 256 x 64-token
    # cache step in ~8.2 ms, what ~800 tokens give; the 16 blocks they hold would give 9.0.
    blocks = BlockManager(256, 64)
    sched = Scheduler(blocks)
    for i in range(8):
        sched.add(Sequence(str(i), list(range(i * 100, i * 100 + 65)), 65))
    for seq in sched.complete(sched.schedule()):
        sched.append_token(seq, 7)
    step = sched.schedule()
    s = StepShape.of(step, blocks.num_blocks * blocks.block_size)
    assert (s.num_decode, s.decode_context, blocks.num_active_blocks) == (8, 8 * 66, 16)
    u = 8 * 66 / (256 * 64)
    assert PolynomialTiming().decode_ms(s) == pytest.approx(-25.74 * u * u + 54.01 * u + 5.74)


def test_decode_time_is_at_least_one_ms():
    model = PolynomialTiming()
    # u > 2.2 is outside the fitted range and would go negative without the floor.
    assert model.decode_ms(shape(decode=1, context=2500, total=1000)) == 1.0


def test_step_is_prefill_plus_decode_over_speedup():
    timer = StepTimer(speedup_ratio=2.0)
    s = shape(prefill=100, decode=3, context=100)
    model = PolynomialTiming()
    expected = (model.prefill_ms(s) + model.decode_ms(s)) / 2.0 / 1000
    assert timer.step_seconds(s) == pytest.approx(expected)


def test_no_prefill_term_without_prefill_tokens():
    timer = StepTimer()
    s = shape(decode=4, context=0)
    assert timer.step_seconds(s) == pytest.approx(5.74 / 1000)


def test_decode_speedup_applies_to_decode_only():
    timer = StepTimer(speedup_ratio=1.0, decode_speedup_ratio=4.0)
    s = shape(prefill=10, decode=1, context=0)
    model = PolynomialTiming()
    assert timer.step_seconds(s) == pytest.approx((model.prefill_ms(s) + 5.74 / 4) / 1000)


def test_prefill_worker_has_no_decode_time():
    timer = StepTimer(prefill_only=True)
    s = shape(prefill=64, decode=1, context=10)
    assert timer.step_seconds(s) == pytest.approx(PolynomialTiming().prefill_ms(s) / 1000)


def test_speedup_zero_is_instant():
    assert StepTimer(speedup_ratio=0).step_seconds(shape(prefill=8000, decode=200)) == 0.0


def test_scheduled_step_duration_matches_the_model():
    blocks = BlockManager(100, 16)
    sched = Scheduler(blocks)
    sched.add(Sequence("a", list(range(40)), 40))
    step = sched.schedule()
    s = StepShape.of(step, blocks.num_blocks * blocks.block_size)
    assert (s.prefill_tokens, s.num_decode, s.decode_context) == (40, 0, 0)
    ms = 4.209989e-7 * 1600 + 1.518344e-2 * 40 + 16.50142  # prefill only: no decode term
    assert StepTimer().step_seconds(s) == pytest.approx(ms / 1000)
    sched.complete(step)
    sched.append_token(sched.running[0], 5)
    sched.add(Sequence("b", list(range(50, 60)), 10))
    step = sched.schedule()
    s = StepShape.of(step, blocks.num_blocks * blocks.block_size)
    # The decode term counts only the decoding sequence's 41 tokens, not b's prefill.
    assert (s.prefill_tokens, s.num_decode, s.decode_context) == (10, 1, 41)
    u = 41 / 1600
    ms = 4.209989e-7 * 100 + 1.518344e-2 * 10 + 16.50142 + (-25.74 * u * u + 54.01 * u + 5.74)
    assert StepTimer().step_seconds(s) == pytest.approx(ms / 1000)


PROFILE = {
    "prefill": {"tokens": [100, 1000], "ms": [10.0, 100.0]},
    "decode": {"batch_size": [1, 9], "context": [100, 300], "ms": [[2.0, 4.0], [6.0, 8.0]]},
}


def test_profile_interpolates_and_clamps(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(PROFILE))
    model = ProfileTiming.from_file(path)
    assert model.prefill_ms(shape(prefill=550)) == pytest.approx(55.0)
    assert model.prefill_ms(shape(prefill=5000)) == pytest.approx(100.0)
    assert model.prefill_ms(shape(prefill=1)) == pytest.approx(10.0)
    # batch 5 (halfway), mean context 200 (halfway): the middle of the table
    assert model.decode_ms(shape(decode=5, context=1000)) == pytest.approx(5.0)
    assert model.decode_ms(shape(decode=1, context=300)) == pytest.approx(4.0)
    assert model.decode_ms(shape(decode=20, context=50)) == pytest.approx(6.0)


@pytest.mark.parametrize(
    "broken",
    [
        {"prefill": {"tokens": [1], "ms": [1.0]}},
        {**PROFILE, "prefill": {"tokens": [10, 5], "ms": [1.0, 2.0]}},
        {**PROFILE, "decode": {**PROFILE["decode"], "ms": [[1.0]]}},
    ],
)
def test_bad_profiles_are_rejected(broken):
    with pytest.raises(ValueError, match="profile"):
        ProfileTiming(broken)


def test_unreadable_profile_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        ProfileTiming.from_file(path)
