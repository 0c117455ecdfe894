"""TLS and credentials through to NATS and etcd, against real servers with certificates
the test makes."""

from __future__ import annotations

import asyncio

import pytest

from stator.runtime import Runtime, RuntimeConfig
from stator.runtime.errors import DiscoveryUnavailable, EventPlaneUnavailable
from tests.certs import make_certs
from tests.runtime.cluster import etcd_server, nats_server

pytestmark = pytest.mark.integration


async def test_nats_with_tls_client_certificates_and_a_token(tmp_path):
    certs = make_certs(tmp_path)
    tls = [
        "--tls", "--tlscert", str(certs.server.cert), "--tlskey", str(certs.server.key),
        "--tlscacert", str(certs.ca), "--tlsverify", "--auth", "t0ken",
    ]  # fmt: skip
    with nats_server(tmp_path, *tls) as url:
        config = RuntimeConfig(
            discovery="mem:nats-tls",
            event_plane=url.replace("nats://", "tls://"),
            nats_tls_ca=str(certs.ca),
            nats_tls_cert=str(certs.client.cert),
            nats_tls_key=str(certs.client.key),
            nats_token="t0ken",
        )
        runtime = await Runtime.create(config)
        try:
            events = runtime.event_plane.subscribe("stator.test")
            receive = asyncio.ensure_future(anext(events))
            await asyncio.sleep(0.2)
            await runtime.event_plane.publish("stator.test.x", b"hello")
            topic, payload = await asyncio.wait_for(receive, 10)
            assert (topic, payload) == ("stator.test.x", b"hello")
        finally:
            await runtime.shutdown()
        wrong = RuntimeConfig(
            discovery="mem:nats-tls",
            event_plane=url.replace("nats://", "tls://"),
            nats_tls_ca=str(certs.ca),
            nats_tls_cert=str(certs.client.cert),
            nats_tls_key=str(certs.client.key),
            nats_token="wrong",
        )
        with pytest.raises(EventPlaneUnavailable):
            await Runtime.create(wrong)


async def test_etcd_over_https_with_client_certificates(tmp_path):
    certs = make_certs(tmp_path)
    tls = [
        "--cert-file", str(certs.server.cert), "--key-file", str(certs.server.key),
        "--trusted-ca-file", str(certs.ca), "--client-cert-auth",
    ]  # fmt: skip
    with etcd_server(tmp_path, *tls, scheme="https") as address:
        config = RuntimeConfig(
            discovery=f"etcd://{address}",
            event_plane="inproc",
            etcd_tls_ca=str(certs.ca),
            etcd_tls_cert=str(certs.client.cert),
            etcd_tls_key=str(certs.client.key),
        )
        runtime = await Runtime.create(config)
        try:
            await runtime.discovery.put("stator/test/k", b"v")
            assert await runtime.discovery.get_prefix("stator/test/") == {"stator/test/k": b"v"}
        finally:
            await runtime.shutdown()
        bare = RuntimeConfig(discovery=f"etcd://{address}", event_plane="inproc")
        with pytest.raises(DiscoveryUnavailable):
            await Runtime.create(bare)
