"""The Kubernetes connector against a FAKED API server (no cluster can run here): an
aiohttp app that answers the two calls the connector makes (list Deployments by label,
patch the scale subresource) the way the apps/v1 API does, so the official client's
requests, label selectors and JSON shapes are exercised for real."""

from __future__ import annotations

import json

import pytest
from aiohttp import web

pytest.importorskip("kubernetes")

from kubernetes import client

from stator.planner.connectors.kubernetes import KubernetesConnector


def deployment(name: str, role: str, replicas: int, pool: str | None = None) -> dict:
    labels = {"app.kubernetes.io/name": "stator", "app.kubernetes.io/component": "worker"}
    labels["stator-role"] = role
    if pool:
        labels["stator-pool"] = pool
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "serving", "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": []}},
        },
    }


class FakeApi:
    def __init__(self, deployments: list[dict]) -> None:
        self.deployments = {d["metadata"]["name"]: d for d in deployments}
        self.patches: list[tuple[str, dict, str]] = []

    def matches(self, d: dict, selector: str) -> bool:
        labels = d["metadata"]["labels"]
        for term in filter(None, selector.split(",")):
            key, _, value = term.partition("=")
            if labels.get(key) != value:
                return False
        return True

    async def list(self, request: web.Request) -> web.Response:
        assert request.match_info["ns"] == "serving"
        selector = request.query.get("labelSelector", "")
        items = [d for d in self.deployments.values() if self.matches(d, selector)]
        body = {"apiVersion": "apps/v1", "kind": "DeploymentList", "metadata": {}, "items": items}
        return web.json_response(body)

    async def patch_scale(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = json.loads(await request.read())
        self.patches.append((name, body, request.content_type))
        d = self.deployments[name]
        d["spec"]["replicas"] = body["spec"]["replicas"]
        scale = {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": name, "namespace": "serving"},
            "spec": {"replicas": d["spec"]["replicas"]},
            "status": {"replicas": d["spec"]["replicas"]},
        }
        return web.json_response(scale)


@pytest.fixture
async def fake_api():
    api = FakeApi(
        [
            deployment("stator-worker", "aggregated", 2),
            deployment("stator-worker-prefill", "prefill", 1, pool="fast"),
            deployment("stator-worker-decode", "decode", 3, pool="fast"),
            deployment("stator-worker-decode-slow", "decode", 1, pool="slow"),
        ]
    )
    app = web.Application()
    base = "/apis/apps/v1/namespaces/{ns}/deployments"
    app.router.add_get(base, api.list)
    app.router.add_patch(base + "/{name}/scale", api.patch_scale)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    config = client.Configuration(host=f"http://127.0.0.1:{port}")
    yield api, client.ApiClient(config)
    await runner.cleanup()


async def test_reads_and_scales_the_deployment_of_a_role(fake_api):
    api, api_client = fake_api
    k8s = KubernetesConnector("serving", api_client=api_client)
    assert await k8s.current("stator", "aggregated") == 2
    await k8s.scale("stator", "aggregated", 5)
    assert api.deployments["stator-worker"]["spec"]["replicas"] == 5
    name, body, content_type = api.patches[-1]
    assert (name, body) == ("stator-worker", {"spec": {"replicas": 5}})
    assert "merge-patch" in content_type or "strategic-merge-patch" in content_type
    assert await k8s.current("stator", "aggregated") == 5
    await k8s.close()


async def test_pools_by_label_and_ambiguity_is_an_error(fake_api):
    api, api_client = fake_api
    pooled = KubernetesConnector("serving", api_client=api_client, pool_label=True)
    assert await pooled.current("fast", "decode") == 3
    await pooled.scale("slow", "decode", 2)
    assert api.deployments["stator-worker-decode-slow"]["spec"]["replicas"] == 2
    unpooled = KubernetesConnector("serving", api_client=api_client)
    with pytest.raises(LookupError, match="found 2"):
        await unpooled.current("fast", "decode")
    with pytest.raises(LookupError, match="found 0"):
        await pooled.current("nowhere", "prefill")
