"""Grid lookup, clamping, priority overrides and the fallback order."""

from __future__ import annotations

from stator.global_router import fallback_order, parse_config, select
from tests.global_router.test_config import DYNAMO


def grids():
    config = parse_config(DYNAMO)
    return config.prefill_grid, config.decode_grid


def test_grid_index_is_dynamos_bucket_and_clamps():
    prefill, _ = grids()
    # isl step 4000, ttft step 500 (10..1010)
    assert prefill.x_index(0) == 0
    assert prefill.x_index(3999) == 0
    assert prefill.x_index(4000) == 1
    assert prefill.x_index(10**9) == 1  # clamped high
    assert prefill.x_index(-5) == 0  # clamped low
    assert prefill.y_index(509) == 0
    assert prefill.y_index(510) == 1
    assert prefill.y_index(1e6) == 1


def test_select_reads_the_mapping():
    prefill, decode = grids()
    assert select(prefill, 100, 50).pool == 0  # short prompt, tight TTFT
    assert select(prefill, 100, 900).pool == 1  # short prompt, loose TTFT
    assert select(prefill, 7000, 900).pool == 0  # long prompt
    assert select(decode, 100, 10).pool == 0
    assert select(decode, 100, 100).pool == 1
    assert select(prefill, 100, 900).cell == (0, 1)


def test_missing_target_uses_the_midpoint():
    prefill, _ = grids()
    # midpoint 510 -> ttft index 1
    assert select(prefill, 100, None).cell == (0, 1)


def test_priority_override_wins_first_rule():
    prefill, _ = grids()
    chosen = select(prefill, 100, 50, priority=7)
    assert (chosen.pool, chosen.reason) == (1, "priority")
    assert select(prefill, 100, 50, priority=4).reason == "grid"


def test_fallback_order_is_by_grid_distance():
    config = parse_config(
        {
            "prefill_pool_namespaces": ["a", "b", "c", "d"],
            "prefill_pool_selection_strategy": {
                "isl_min": 0,
                "isl_max": 300,
                "isl_resolution": 3,
                "ttft_min": 0,
                "ttft_max": 300,
                "ttft_resolution": 3,
                "prefill_pool_mapping": [[0, 0, 1], [2, 0, 1], [2, 2, 1]],
            },
        }
    )
    grid = config.prefill_grid
    chosen = select(grid, 50, 50)  # cell (0, 0) -> pool 0
    # pool 2 is one step away (1, 0), pool 1 two steps (0, 2); pool 3 is on no cell.
    assert fallback_order(grid, chosen, 4) == [0, 2, 1, 3]
    chosen = select(grid, 50, 250)  # (0, 2) -> pool 1; pool 0 at (0, 1), pool 2 at (2, 1)
    assert fallback_order(grid, chosen, 4) == [1, 0, 2, 3]
