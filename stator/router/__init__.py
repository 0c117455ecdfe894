"""Routing: pick a worker for each request, track load, migrate failed streams."""

from stator.router.busy import BusyThresholds
from stator.router.config import ROUTER_MODES, RouterConfig
from stator.router.errors import BadRouting, Overloaded
from stator.router.kv_index import KvIndex
from stator.router.router import Router

__all__ = [
    "ROUTER_MODES",
    "BadRouting",
    "BusyThresholds",
    "KvIndex",
    "Overloaded",
    "Router",
    "RouterConfig",
]
