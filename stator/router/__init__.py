"""Routing: pick a worker for each request, track load, migrate failed streams."""

from stator.router.config import RouterConfig
from stator.router.errors import Overloaded
from stator.router.router import Router

__all__ = ["Overloaded", "Router", "RouterConfig"]
