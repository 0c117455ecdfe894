"""`ExportTable`: pins, their timeout, claims, and releases that come before the pin (the
router's caller left while the prefill still ran)."""

from __future__ import annotations

from types import SimpleNamespace

from stator.engines.native.kv_handoff import ExportTable


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def seq(rid: str) -> SimpleNamespace:
    """What the table reads of a sequence: its block ids."""
    return SimpleNamespace(request_id=rid, block_ids=[1, 2, 3])


def test_a_release_before_the_pin_with_later_drops_that_pin_as_it_comes():
    clock = Clock()
    table = ExportTable(timeout=10.0, clock=clock)
    assert table.release("r1", unless_claimed=True, later=True) is None
    assert not table.released_early("other")
    table.pin("r1", seq("r1"), 40, 16)
    assert table.released_early("r1")  # the caller says: release it now
    assert not table.released_early("r1")  # once
    assert table.num_released_at_pin == 1


def test_an_early_release_is_forgotten_after_the_pin_timeout():
    clock = Clock()
    table = ExportTable(timeout=10.0, clock=clock)
    table.release("r1", later=True)
    clock.now += 5
    table.release("r2", later=True)
    clock.now += 5.5  # r1's 10 s are over, r2's not
    assert not table.released_early("r1")
    assert table.released_early("r2")
    assert table.num_released_at_pin == 1


def test_without_later_or_with_a_pin_present_nothing_is_remembered():
    clock = Clock()
    table = ExportTable(timeout=10.0, clock=clock)
    table.release("r1")  # nothing pinned, not `later`: e.g. a decode side's late release
    assert not table.released_early("r1")
    s = seq("r2")
    table.pin("r2", s, 40, 16)
    assert table.release("r2", later=True) is s  # pinned: released now, nothing kept
    assert not table.released_early("r2")
    table.pin("r3", seq("r3"), 40, 16)
    table.claim("r3")
    assert table.release("r3", unless_claimed=True, later=True) is None  # its reader's
    assert not table.released_early("r3") and len(table) == 1
