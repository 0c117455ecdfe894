"""The planner: a pure state machine (observed load + profile -> worker counts per pool)
with thin connectors that apply its decisions; and the profiler that measures a worker."""

from stator.planner.profile import PerfProfile

__all__ = ["PerfProfile"]
