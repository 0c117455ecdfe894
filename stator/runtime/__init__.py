"""The distributed runtime: discovery, request plane, event plane, lifecycle."""

from stator.runtime.client import Client
from stator.runtime.discovery import Discovery, WatchEvent, open_discovery
from stator.runtime.errors import (
    CannotConnect,
    EndpointNotFound,
    EngineShutdown,
    Migratable,
    NoInstances,
    RemoteError,
    StreamDisconnected,
)
from stator.runtime.event_plane import EventPlane, open_event_plane
from stator.runtime.lifecycle import Lifecycle, run_main
from stator.runtime.names import EndpointName, InstanceInfo
from stator.runtime.runtime import Runtime, RuntimeConfig

__all__ = [
    "CannotConnect",
    "Client",
    "Discovery",
    "EndpointName",
    "EndpointNotFound",
    "EngineShutdown",
    "EventPlane",
    "InstanceInfo",
    "Lifecycle",
    "Migratable",
    "NoInstances",
    "RemoteError",
    "Runtime",
    "RuntimeConfig",
    "StreamDisconnected",
    "WatchEvent",
    "open_discovery",
    "open_event_plane",
    "run_main",
]
