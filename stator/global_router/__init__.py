"""The global router: picks a pool (a namespace of workers) for each request from the
ISL×TTFT and context×ITL grids, falls back to the nearest pool that can serve, and lets
the pool's own router pick the worker."""

from stator.global_router.config import ConfigError, PoolSelectionConfig, load_config, parse_config
from stator.global_router.router import GlobalRouter
from stator.global_router.selection import Selection, fallback_order, select
from stator.global_router.service import GlobalRouterConfig, build_global_router

__all__ = [
    "ConfigError",
    "GlobalRouter",
    "GlobalRouterConfig",
    "PoolSelectionConfig",
    "Selection",
    "build_global_router",
    "fallback_order",
    "load_config",
    "parse_config",
    "select",
]
