"""etcd discovery: real etcd v3 through its JSON gateway (`/v3/...` over HTTP, keys and
values base64), so no gRPC stack is needed.

The lease id is chosen here (random 63-bit) and asked of etcd at grant time, so it is
known before `start` and doubles as the instance id. Keys are put with the lease; a
keep-alive every ttl/3 holds it. If the lease is lost anyway (this process stalled past
the TTL, or etcd restarted without its data), it is granted again under the same id and
this object's keys are written back. Watches read etcd's streaming watch; after a broken
stream they re-read the prefix and report the difference, so no change is lost.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import random
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from stator.runtime.discovery.base import Discovery, WatchEvent
from stator.runtime.errors import DiscoveryUnavailable

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 5.0
RETRY_DELAY = 0.5


def _b64(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text) if text else b""


class _Unauthorized(Exception):
    pass


def prefix_range_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with `prefix` (etcd's range idiom)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\0"  # every key
    return stripped[:-1] + bytes([stripped[-1] + 1])


class EtcdDiscovery(Discovery):
    def __init__(
        self,
        endpoints: str,
        ttl: float = 5.0,
        *,
        tls: ssl.SSLContext | None = None,
        user: str | None = None,
        password: str = "",
    ) -> None:
        hosts = [h.strip() for h in endpoints.split(",") if h.strip()]
        if not hosts:
            raise ValueError("etcd discovery needs host:port, e.g. etcd://127.0.0.1:2379")
        scheme = "https" if tls is not None else "http"
        self.urls = [h if h.startswith("http") else f"{scheme}://{h}" for h in hosts]
        self.tls = tls
        self.user = user
        self.password = password
        self._headers: dict[str, str] = {}
        # etcd rounds TTLs to whole seconds and refuses very short ones.
        self.ttl = max(2, math.ceil(ttl))
        self.lease_id = random.getrandbits(63) or 1
        self._current = 0  # index of the endpoint that last answered
        self._session: aiohttp.ClientSession | None = None
        self._owned: dict[str, bytes] = {}
        self._keepalive: asyncio.Task | None = None
        self._closed = asyncio.Event()
        self._watch_responses: set[aiohttp.ClientResponse] = set()

    # -- HTTP ------------------------------------------------------------------------

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
                connector=aiohttp.TCPConnector(ssl=self.tls) if self.tls else None,
            )
        if self.user and not self._headers and path != "/v3/auth/authenticate":
            await self._authenticate()
        try:
            return await self._post_once(path, body)
        except _Unauthorized:
            if not self.user:
                raise DiscoveryUnavailable("etcd wants authentication: pass --etcd-user") from None
            await self._authenticate()  # the token expired
            return await self._post_once(path, body)

    async def _authenticate(self) -> None:
        self._headers = {}
        reply = await self._post_once(
            "/v3/auth/authenticate", {"name": self.user, "password": self.password}
        )
        self._headers = {"Authorization": reply.get("token", "")}

    async def _post_once(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert self._session is not None
        errors = []
        for step in range(len(self.urls)):
            index = (self._current + step) % len(self.urls)
            url = self.urls[index] + path
            try:
                async with self._session.post(url, json=body, headers=self._headers) as resp:
                    payload = await resp.json(content_type=None)
                    if resp.status == 401 or (
                        resp.status != 200 and "token" in str(payload.get("message", ""))
                    ):
                        raise _Unauthorized(str(payload))
                    if resp.status != 200:
                        message = payload.get("message") or payload.get("error") or payload
                        raise DiscoveryUnavailable(
                            f"etcd at {url} answered {resp.status}: {message}"
                        )
                    self._current = index
                    return payload
            except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
                errors.append(f"{url}: {exc or type(exc).__name__}")
        raise DiscoveryUnavailable("etcd unreachable: " + "; ".join(errors))

    # -- lease -----------------------------------------------------------------------

    async def start(self) -> None:
        if self._keepalive is not None:
            return
        if self._closed.is_set():
            raise RuntimeError("discovery is closed")
        await self._grant()
        self._keepalive = asyncio.create_task(self._keep_alive(), name="etcd lease keep-alive")

    async def _grant(self) -> None:
        for _ in range(5):
            try:
                await self._post("/v3/lease/grant", {"TTL": self.ttl, "ID": str(self.lease_id)})
                return
            except DiscoveryUnavailable as exc:
                if "lease already exists" not in str(exc):
                    raise
                self.lease_id = random.getrandbits(63) or 1
        raise DiscoveryUnavailable("etcd: could not find a free lease id")

    async def _keep_alive(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), self.ttl / 3)
            if self._closed.is_set():
                return
            try:
                reply = await self._post("/v3/lease/keepalive", {"ID": str(self.lease_id)})
                if int(reply.get("result", {}).get("TTL", 0)) <= 0:
                    log.warning("etcd lease %x expired: granting it again", self.lease_id)
                    await self._grant()
                    for key, value in list(self._owned.items()):
                        await self._put(key, value)
            except DiscoveryUnavailable as exc:
                log.warning("etcd keep-alive failed: %s", exc)

    # -- keys ------------------------------------------------------------------------

    async def _put(self, key: str, value: bytes) -> None:
        body = {"key": _b64(key), "value": _b64(value), "lease": str(self.lease_id)}
        await self._post("/v3/kv/put", body)

    async def put(self, key: str, value: bytes) -> None:
        if self._closed.is_set():
            raise RuntimeError("discovery is closed")
        await self.start()
        await self._put(key, value)
        self._owned[key] = value

    async def delete(self, key: str) -> None:
        self._owned.pop(key, None)
        await self._post("/v3/kv/deleterange", {"key": _b64(key)})

    async def _range(self, prefix: str) -> tuple[dict[str, bytes], int]:
        raw = prefix.encode()
        reply = await self._post(
            "/v3/kv/range", {"key": _b64(raw), "range_end": _b64(prefix_range_end(raw))}
        )
        found = {
            _unb64(kv["key"]).decode(): _unb64(kv.get("value", "")) for kv in reply.get("kvs", [])
        }
        return found, int(reply["header"]["revision"])

    async def get_prefix(self, prefix: str) -> dict[str, bytes]:
        return (await self._range(prefix))[0]

    # -- watch -----------------------------------------------------------------------

    async def watch(self, prefix: str) -> AsyncIterator[WatchEvent]:
        if self._closed.is_set():
            raise RuntimeError("discovery is closed")
        known: dict[str, bytes] = {}
        while not self._closed.is_set():
            try:
                current, revision = await self._range(prefix)
                for key, value in current.items():
                    if known.get(key) != value:
                        yield WatchEvent("put", key, value)
                for key in known.keys() - current.keys():
                    yield WatchEvent("delete", key)
                known = current
                async for event in self._stream(prefix, revision + 1):
                    if event.kind == "put":
                        known[event.key] = event.value
                    else:
                        known.pop(event.key, None)
                    yield event
            except DiscoveryUnavailable as exc:
                log.warning("etcd watch of %s interrupted: %s", prefix, exc)
            if not self._closed.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closed.wait(), RETRY_DELAY)

    async def _stream(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Events of one watch stream, from `start_revision`, until it breaks."""
        raw = prefix.encode()
        body = {
            "create_request": {
                "key": _b64(raw),
                "range_end": _b64(prefix_range_end(raw)),
                "start_revision": str(start_revision),
            }
        }
        assert self._session is not None
        url = self.urls[self._current] + "/v3/watch"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=REQUEST_TIMEOUT)
        try:
            async with self._session.post(
                url, json=body, timeout=timeout, headers=self._headers
            ) as resp:
                self._watch_responses.add(resp)
                try:
                    async for message in _json_stream(resp.content):
                        result = message.get("result") or {}
                        if result.get("canceled") or "error" in message:
                            return  # compacted or refused: the caller re-reads the prefix
                        for ev in result.get("events", []):
                            kv = ev.get("kv", {})
                            key = _unb64(kv.get("key", "")).decode()
                            if ev.get("type") == "DELETE":
                                yield WatchEvent("delete", key)
                            else:
                                yield WatchEvent("put", key, _unb64(kv.get("value", "")))
                finally:
                    self._watch_responses.discard(resp)
        except (aiohttp.ClientError, ValueError) as exc:
            if not self._closed.is_set():
                raise DiscoveryUnavailable(f"etcd watch at {url} failed: {exc}") from exc

    # -- close -----------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        for resp in list(self._watch_responses):
            resp.close()
        if self._keepalive is not None:
            await self._keepalive
            try:
                # Revoking the lease deletes every key bound to it, in one step.
                await self._post("/v3/lease/revoke", {"ID": str(self.lease_id)})
            except DiscoveryUnavailable as exc:
                log.warning("could not revoke etcd lease (it expires in %ss): %s", self.ttl, exc)
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _json_stream(content: aiohttp.StreamReader) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a streamed gateway response (concatenated, maybe with
    newlines between them)."""
    decoder = json.JSONDecoder()
    buffer = ""
    async for chunk in content.iter_any():
        buffer += chunk.decode()
        while True:
            buffer = buffer.lstrip()
            if not buffer:
                break
            try:
                obj, end = decoder.raw_decode(buffer)
            except json.JSONDecodeError:
                break  # incomplete: wait for more bytes
            buffer = buffer[end:]
            yield obj
