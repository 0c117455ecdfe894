"""Request planes: in-process (direct call) and TCP (msgpack frames, multiplexed)."""

from __future__ import annotations

from stator.runtime.request_plane.base import Handler, RequestClient, RequestServer
from stator.runtime.request_plane.inproc import InprocClient, InprocServer
from stator.runtime.security import FleetSecurity


def make_server(
    transport: str, host: str = "127.0.0.1", port: int = 0, security: FleetSecurity | None = None
) -> RequestServer:
    if transport == "inproc":
        return InprocServer()
    if transport == "tcp":
        from stator.runtime.request_plane.tcp import TcpServer

        return TcpServer(host, port, security=security)
    raise ValueError(f"unknown request plane {transport!r}: use inproc or tcp")


def make_client(transport: str, security: FleetSecurity | None = None) -> RequestClient:
    if transport == "inproc":
        return InprocClient()
    if transport == "tcp":
        from stator.runtime.request_plane.tcp import TcpClient

        return TcpClient(security=security)
    raise ValueError(f"unknown request plane {transport!r}: use inproc or tcp")


__all__ = [
    "Handler",
    "InprocClient",
    "InprocServer",
    "RequestClient",
    "RequestServer",
    "make_client",
    "make_server",
]
