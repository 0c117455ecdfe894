"""Router configuration (flags of `stator frontend` / `stator run`)."""

from __future__ import annotations

from dataclasses import dataclass

from stator.config import option

ROUTER_MODES = ["round-robin", "random"]


@dataclass
class RouterConfig:
    router_mode: str = option("round-robin", "How to pick a worker", choices=ROUTER_MODES)
