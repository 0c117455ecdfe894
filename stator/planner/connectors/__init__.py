"""Connectors apply the planner's decisions: thin adapters with one interface.

- `local`: starts and stops `stator worker` processes on this host (GPU ids assigned).
- `kubernetes`: scales the Deployments of `deploy/` through the official client.

Scale-down always drains: the worker first leaves discovery, then finishes its in-flight
requests, then exits (the worker's SIGTERM path; in Kubernetes, the pod's termination
grace period and preStop of `deploy/`).
"""

from __future__ import annotations

from typing import Protocol


class Connector(Protocol):
    async def current(self, pool: str, role: str) -> int:
        """Workers of (pool, role) the connector runs or is starting (not draining)."""
        ...

    async def scale(self, pool: str, role: str, desired: int) -> None: ...

    async def close(self) -> None: ...
