"""`KubernetesConnector`: scales the worker Deployments of `deploy/kubernetes` through the
official `kubernetes` client (`pip install 'stator[kubernetes]'`).

A (pool, role)'s Deployment is found by its labels: `app.kubernetes.io/component=worker`,
`stator-role=<role>` (aggregated | prefill | decode, as `deploy/` sets them) and, where
several pools share a Kubernetes namespace, `stator-pool=<pool>`. Scaling patches the
Deployment's `scale` subresource (RBAC: `deploy/kubernetes/components/planner/rbac.yaml`).
Scale-down drains through the pod lifecycle: Kubernetes sends SIGTERM, the worker leaves
discovery and finishes its in-flight requests within `terminationGracePeriodSeconds`.

Tested against a faked API server only (tests/planner/test_kubernetes.py): no cluster
can run where stator's tests run.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

log = logging.getLogger(__name__)

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class KubernetesConnector:
    def __init__(
        self,
        namespace: str | None = None,
        *,
        api_client=None,
        pool_label: bool = False,
    ) -> None:
        """`namespace`: the Kubernetes namespace (default: the pod's own). `api_client`: a
        configured `kubernetes.client.ApiClient` (default: in-cluster config, else
        ~/.kube/config). `pool_label`: also select Deployments by `stator-pool`."""
        from kubernetes import client, config

        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self.apps = client.AppsV1Api(api_client)
        if namespace is None:
            namespace = _SA_NAMESPACE.read_text().strip() if _SA_NAMESPACE.exists() else "default"
        self.namespace = namespace
        self.pool_label = pool_label

    def _selector(self, pool: str, role: str) -> str:
        labels = ["app.kubernetes.io/component=worker", f"stator-role={role}"]
        if self.pool_label:
            labels.append(f"stator-pool={pool}")
        return ",".join(labels)

    def _deployment(self, pool: str, role: str):
        selector = self._selector(pool, role)
        found = self.apps.list_namespaced_deployment(self.namespace, label_selector=selector)
        if len(found.items) != 1:
            names = [d.metadata.name for d in found.items]
            raise LookupError(
                f"expected one worker Deployment matching {selector!r} in namespace "
                f"{self.namespace}, found {len(names)}: {names}"
            )
        return found.items[0]

    async def current(self, pool: str, role: str) -> int:
        deployment = await asyncio.to_thread(self._deployment, pool, role)
        return deployment.spec.replicas or 0

    def _scale(self, pool: str, role: str, desired: int) -> None:
        name = self._deployment(pool, role).metadata.name
        self.apps.patch_namespaced_deployment_scale(
            name, self.namespace, {"spec": {"replicas": desired}}
        )
        log.info("scaled Deployment %s/%s to %d replicas", self.namespace, name, desired)

    async def scale(self, pool: str, role: str, desired: int) -> None:
        await asyncio.to_thread(self._scale, pool, role, desired)

    async def close(self) -> None:
        self.apps.api_client.close()
