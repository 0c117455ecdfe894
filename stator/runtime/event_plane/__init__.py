"""Event planes behind one interface; `open_event_plane(url, ...)` picks one.

- `inproc` or `inproc:NAME`: one process
- `zmq`: each publisher binds a PUB socket on the runtime's host and announces it in
  discovery; subscribers connect to every announced publisher
- `nats://host:port`: NATS subjects
"""

from __future__ import annotations

from typing import Any

from stator.runtime.discovery import Discovery
from stator.runtime.event_plane.base import EventPlane
from stator.runtime.event_plane.inproc import InprocEventPlane


def open_event_plane(
    url: str,
    *,
    discovery: Discovery,
    namespace: str,
    host: str = "127.0.0.1",
    nats_options: dict[str, Any] | None = None,
) -> EventPlane:
    if url == "inproc" or url.startswith("inproc:"):
        name = url.split(":", 1)[1] if ":" in url else "default"
        return InprocEventPlane(name or "default")
    if url == "zmq" or url.startswith("zmq:"):
        from stator.runtime.event_plane.zmq import ZmqEventPlane

        return ZmqEventPlane(discovery=discovery, namespace=namespace, host=host)
    if url.startswith(("nats://", "tls://")):
        from stator.runtime.event_plane.nats import NatsEventPlane

        return NatsEventPlane(url, options=nats_options)
    raise ValueError(f"unknown event plane {url!r}: use inproc, zmq or nats://host:port")


__all__ = ["EventPlane", "InprocEventPlane", "open_event_plane"]
