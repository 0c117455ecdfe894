import json

import pytest

from stator.engines.mocker.block_manager import BlockManager
from stator.engines.mocker.scheduler import Scheduler, Sequence
from stator.engines.mocker.timing import PolynomialTiming, ProfileTiming, StepShape, StepTimer


def shape(prefill=0, decode=0, context=0, active=0, total=1000) -> StepShape:
    return StepShape(prefill, decode, context, active, total)


def test_prefill_and_decode_polynomials():
    model = PolynomialTiming()
    assert model.prefill_ms(shape(prefill=512)) == pytest.approx(
        4.209989e-7 * 512**2 + 1.518344e-2 * 512 + 16.50142
    )
    assert model.decode_ms(shape(decode=1, active=500)) == pytest.approx(
        -25.74 * 0.25 + 54.01 * 0.5 + 5.74
    )
    assert model.decode_ms(shape(decode=1, active=0)) == pytest.approx(5.74)


def test_decode_time_is_at_least_one_ms():
    model = PolynomialTiming()
    # u > 2.2 is outside the fitted range and would go negative without the floor.
    assert model.decode_ms(shape(decode=1, active=2500, total=1000)) == 1.0


def test_step_is_prefill_plus_decode_over_speedup():
    timer = StepTimer(speedup_ratio=2.0)
    s = shape(prefill=100, decode=3, active=100)
    model = PolynomialTiming()
    expected = (model.prefill_ms(s) + model.decode_ms(s)) / 2.0 / 1000
    assert timer.step_seconds(s) == pytest.approx(expected)


def test_no_prefill_term_without_prefill_tokens():
    timer = StepTimer()
    s = shape(decode=4, active=0)
    assert timer.step_seconds(s) == pytest.approx(5.74 / 1000)


def test_decode_speedup_applies_to_decode_only():
    timer = StepTimer(speedup_ratio=1.0, decode_speedup_ratio=4.0)
    s = shape(prefill=10, decode=1, active=0)
    model = PolynomialTiming()
    assert timer.step_seconds(s) == pytest.approx((model.prefill_ms(s) + 5.74 / 4) / 1000)


def test_prefill_worker_has_no_decode_time():
    timer = StepTimer(prefill_only=True)
    s = shape(prefill=64, active=10)
    assert timer.step_seconds(s) == pytest.approx(PolynomialTiming().prefill_ms(s) / 1000)


def test_speedup_zero_is_instant():
    assert StepTimer(speedup_ratio=0).step_seconds(shape(prefill=8000, decode=200)) == 0.0


def test_scheduled_step_duration_matches_the_model():
    blocks = BlockManager(100, 16)
    sched = Scheduler(blocks)
    sched.add(Sequence("a", list(range(40)), 40))
    step = sched.schedule()
    s = StepShape.of(step, blocks.num_active_blocks, blocks.num_blocks)
    assert (s.prefill_tokens, s.num_decode, s.active_kv_blocks) == (40, 0, 3)
    ms = 4.209989e-7 * 1600 + 1.518344e-2 * 40 + 16.50142  # prefill only: no decode term
    assert StepTimer().step_seconds(s) == pytest.approx(ms / 1000)
    sched.complete(step)
    sched.append_token(sched.running[0], 5)
    sched.add(Sequence("b", list(range(50, 60)), 10))
    step = sched.schedule()
    s = StepShape.of(step, blocks.num_active_blocks, blocks.num_blocks)
    assert (s.prefill_tokens, s.num_decode, s.active_kv_blocks) == (10, 1, 4)
    u = 4 / 100
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
