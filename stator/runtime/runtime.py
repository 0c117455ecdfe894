"""`Runtime`: one process's (or one in-process worker's) handle on the fleet.

It owns a discovery lease, a request-plane server for the endpoints it serves, a shared
request-plane client for the endpoints it calls, and the event plane. Its instance id is
its discovery lease id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec

from stator.config import option
from stator.protocols import ModelCard, decode, encode
from stator.runtime.client import Client
from stator.runtime.discovery import Discovery, open_discovery
from stator.runtime.event_plane import EventPlane, open_event_plane
from stator.runtime.names import (
    EndpointName,
    InstanceInfo,
    as_endpoint,
    instance_key,
    model_key,
)
from stator.runtime.request_plane import (
    Handler,
    RequestClient,
    RequestServer,
    make_client,
    make_server,
)
from stator.runtime.security import FleetSecurity, client_tls

log = logging.getLogger(__name__)


@dataclass
class RuntimeConfig:
    namespace: str = option("stator", "Namespace: workers and frontends meet inside one")
    discovery: str = option(
        "mem", "Discovery backend: mem | file:DIR | etcd://host:port", metavar="URL"
    )
    discovery_ttl: float = option(
        5.0, "Seconds an entry outlives its owner's last heartbeat (file, etcd)"
    )
    request_plane: str = option(
        "auto", "Request plane: inproc | tcp | auto (inproc with mem discovery, else tcp)"
    )
    event_plane: str = option(
        "auto",
        "Event plane: inproc | zmq | nats://host:port | auto (inproc with mem, else zmq)",
        metavar="URL",
    )
    host: str = option("127.0.0.1", "Address to bind and advertise for the TCP planes")
    rpc_port: int = option(0, "TCP request-plane port (0 = any free port)")
    graceful_shutdown_timeout: float = option(
        30.0, "Seconds to let in-flight requests finish after SIGTERM"
    )
    # -- who may talk to whom (stator.runtime.security) --------------------------------
    fleet_secret: str | None = option(
        None,
        "Shared secret every frontend and worker must prove (HMAC handshake) before the TCP "
        "request plane serves it; set the same on all",
        secret=True,
    )
    fleet_secret_file: str | None = option(None, "File holding --fleet-secret")
    fleet_tls_cert: str | None = option(
        None, "Certificate (PEM) for mutual TLS on the TCP request plane"
    )
    fleet_tls_key: str | None = option(None, "Private key (PEM) of --fleet-tls-cert")
    fleet_tls_ca: str | None = option(
        None, "CA (PEM) that signs every fleet member's certificate; others are refused"
    )
    nats_tls_ca: str | None = option(None, "CA (PEM) to verify the NATS server (turns on TLS)")
    nats_tls_cert: str | None = option(None, "Client certificate (PEM) for NATS")
    nats_tls_key: str | None = option(None, "Private key (PEM) of --nats-tls-cert")
    nats_creds: str | None = option(None, "NATS credentials file (JWT + NKey seed)")
    nats_token: str | None = option(None, "NATS authentication token", secret=True)
    etcd_tls_ca: str | None = option(None, "CA (PEM) to verify etcd (turns on https)")
    etcd_tls_cert: str | None = option(None, "Client certificate (PEM) for etcd")
    etcd_tls_key: str | None = option(None, "Private key (PEM) of --etcd-tls-cert")
    etcd_user: str | None = option(None, "etcd user (with --etcd-password)")
    etcd_password: str | None = option(None, "etcd password", secret=True)

    def fleet_security(self) -> FleetSecurity:
        return FleetSecurity.build(
            self.fleet_secret,
            self.fleet_secret_file,
            self.fleet_tls_cert,
            self.fleet_tls_key,
            self.fleet_tls_ca,
        )

    def nats_options(self) -> dict[str, Any]:
        """TLS and credentials for nats-py's `connect` (a user:password may also be in the
        URL)."""
        options: dict[str, Any] = {}
        if self.nats_tls_ca or self.nats_tls_cert:
            options["tls"] = client_tls(self.nats_tls_ca, self.nats_tls_cert, self.nats_tls_key)
        if self.nats_creds:
            options["user_credentials"] = self.nats_creds
        if self.nats_token:
            options["token"] = self.nats_token
        return options

    def etcd_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.etcd_tls_ca or self.etcd_tls_cert:
            options["tls"] = client_tls(self.etcd_tls_ca, self.etcd_tls_cert, self.etcd_tls_key)
        if self.etcd_user:
            options["user"] = self.etcd_user
            options["password"] = self.etcd_password or ""
        return options

    def resolved_request_plane(self) -> str:
        if self.request_plane != "auto":
            return self.request_plane
        return "inproc" if self.discovery.startswith("mem") else "tcp"

    def resolved_event_plane(self) -> str:
        if self.event_plane != "auto":
            return self.event_plane
        return "inproc" if self.discovery.startswith("mem") else "zmq"


class Runtime:
    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self.namespace = config.namespace
        self.discovery: Discovery = open_discovery(
            config.discovery, ttl=config.discovery_ttl, **config.etcd_options()
        )
        self.security = config.fleet_security()
        self.instance_id = self.discovery.lease_id
        self.event_plane: EventPlane = open_event_plane(
            config.resolved_event_plane(),
            discovery=self.discovery,
            namespace=config.namespace,
            host=config.host,
            nats_options=config.nats_options(),
        )
        self._transport = config.resolved_request_plane()
        self._server: RequestServer | None = None
        self._clients: dict[str, RequestClient] = {}
        self._served: dict[EndpointName, str] = {}  # endpoint -> its instance key
        self._cards: list[str] = []
        self._started = False
        self.started_at = time.time()

    @classmethod
    async def create(cls, config: RuntimeConfig | None = None) -> Runtime:
        runtime = cls(config or RuntimeConfig())
        try:
            await runtime.start()
        except BaseException:
            # Close what did open (an etcd HTTP session, a NATS connection).
            with contextlib.suppress(Exception):
                await runtime.event_plane.close()
            with contextlib.suppress(Exception):
                await runtime.discovery.close()
            raise
        return runtime

    async def start(self) -> None:
        if self._started:
            return
        await self.discovery.start()
        # The lease may only be known after start (etcd grants it).
        self.instance_id = self.discovery.lease_id
        await self.event_plane.start()
        self._started = True

    # -- serving ---------------------------------------------------------------------

    async def _ensure_server(self) -> RequestServer:
        if self._server is None:
            server = make_server(
                self._transport, self.config.host, self.config.rpc_port, self.security
            )
            await server.start()
            self._server = server
        return self._server

    async def serve(
        self,
        name: str | EndpointName,
        handler: Handler,
        request_type: Any = Any,
        *,
        metadata: dict[str, Any] | None = None,
    ) -> InstanceInfo:
        """Serve `handler` at `name` and announce this instance in discovery."""
        endpoint = as_endpoint(name)
        server = await self._ensure_server()
        server.register(str(endpoint), handler, request_type)
        info = InstanceInfo(
            instance_id=self.instance_id,
            namespace=endpoint.namespace,
            component=endpoint.component,
            endpoint=endpoint.endpoint,
            transport=server.transport,  # type: ignore[arg-type]
            address=server.address,
            metadata=metadata or {},
        )
        key = instance_key(endpoint, self.instance_id)
        await self.discovery.put(key, encode(info))
        self._served[endpoint] = key
        log.debug("serving %s at %s (instance %x)", endpoint, server.address, self.instance_id)
        return info

    async def unserve(self, name: str | EndpointName) -> None:
        """Remove this instance of `name` from discovery and refuse new streams."""
        endpoint = as_endpoint(name)
        key = self._served.pop(endpoint, None)
        if key is not None:
            await self.discovery.delete(key)
        if self._server is not None:
            self._server.unregister(str(endpoint))

    async def publish_model_card(
        self, name: str | EndpointName, card: ModelCard, suffix: str | None = None
    ) -> str:
        key = model_key(as_endpoint(name), self.instance_id, suffix)
        await self.discovery.put(key, encode(card))
        if key not in self._cards:
            self._cards.append(key)
        return key

    async def remove_model_card(self, key: str) -> None:
        await self.discovery.delete(key)
        if key in self._cards:
            self._cards.remove(key)

    @property
    def inflight(self) -> int:
        return self._server.inflight if self._server is not None else 0

    # -- calling ---------------------------------------------------------------------

    def request_client(self, transport: str) -> RequestClient:
        client = self._clients.get(transport)
        if client is None:
            client = self._clients[transport] = make_client(transport, self.security)
        return client

    async def client(self, name: str | EndpointName, response_type: Any = Any) -> Client:
        """A started `Client` for `name` that tracks its live instances."""
        client = Client(self, as_endpoint(name), response_type)
        await client.start()
        return client

    # -- events ----------------------------------------------------------------------

    def topic(self, what: str) -> str:
        return f"{self.namespace}.{what}"

    async def publish(self, what: str, obj: Any) -> None:
        """Publish a wire object (or bytes) on topic `namespace.what`."""
        payload = obj if isinstance(obj, bytes) else encode(obj)
        await self.event_plane.publish(self.topic(what), payload)

    async def subscribe(self, what: str, kind: Any = Any) -> AsyncIterator[Any]:
        """Decoded objects published on `namespace.what` (undecodable ones are logged
        and skipped)."""
        async for _topic, payload in self.event_plane.subscribe(self.topic(what)):
            try:
                yield decode(payload, kind)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("dropping undecodable event on %s: %s", what, exc)

    # -- lifecycle -------------------------------------------------------------------

    async def drain(self, grace: float | None = None) -> bool:
        """Unregister every served endpoint, then wait up to `grace` seconds for
        in-flight streams to finish. True if they all finished."""
        grace = self.config.graceful_shutdown_timeout if grace is None else grace
        for endpoint in list(self._served):
            await self.unserve(endpoint)
        for key in list(self._cards):
            await self.remove_model_card(key)
        deadline = time.monotonic() + grace
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self.inflight == 0

    async def shutdown(self, grace: float | None = 0.0) -> None:
        """Drain (for `grace` seconds), then stop serving, close clients and give up the
        discovery lease."""
        if not self._started:
            return
        await self.drain(grace)
        if self._server is not None:
            await self._server.stop()
        for client in self._clients.values():
            await client.close()
        await self.event_plane.close()
        await self.discovery.close()
        self._started = False
