"""Pure pool selection: grid lookup with clamping, priority overrides, and the order in
which the other pools are tried when the chosen one cannot serve.

Dynamo picks one pool and lets any error propagate. stator also ranks every other pool by
how close it sits to the request's cell in the same grid (the fewest steps along ISL/TTFT
or context/ITL to a cell that maps to it), so a request whose pool is empty or overloaded
goes to the pool configured for the most similar requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from stator.global_router.config import Grid


@dataclass(frozen=True, slots=True)
class Selection:
    pool: int
    cell: tuple[int, int]
    # "grid" or "priority" (an override rule picked the pool)
    reason: str


def select(grid: Grid, x: float, y: float | None, priority: int = 0) -> Selection:
    """The pool for a request with ISL/context `x` and target `y` (ms; None: the midpoint
    of the grid's range, as Dynamo does). A matching priority override wins over the grid;
    the first matching rule applies."""
    target = grid.y_midpoint if y is None else y
    cell = (grid.x_index(x), grid.y_index(target))
    for rule in grid.overrides:
        if rule.min_priority <= priority <= rule.max_priority:
            return Selection(rule.target_pool, cell, "priority")
    return Selection(grid.mapping[cell[0]][cell[1]], cell, "grid")


def fallback_order(grid: Grid, selection: Selection, pools: int) -> list[int]:
    """Every pool index, the selected one first, then by grid distance from the request's
    cell to the nearest cell mapped to that pool (ties: lower index first). Pools the grid
    never names come last."""
    i, j = selection.cell
    far = grid.x_resolution + grid.y_resolution + 1

    def distance(pool: int) -> int:
        cells = grid.cells(pool)
        return min((abs(i - a) + abs(j - b) for a, b in cells), default=far)

    others = sorted(
        (p for p in range(pools) if p != selection.pool), key=lambda p: (distance(p), p)
    )
    return [selection.pool, *others]
