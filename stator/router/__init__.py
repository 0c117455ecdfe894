"""Routing: pick a worker for each request, track load, migrate failed streams."""

from stator.router.config import RouterConfig
from stator.router.router import Router

__all__ = ["Router", "RouterConfig"]
