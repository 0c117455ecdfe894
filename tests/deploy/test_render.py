"""Every overlay and recipe renders with `kubectl kustomize`, and every object it makes is
valid: Kubernetes kinds against the API's own schemas (kubernetes-validate, strict: an
unknown field is an error), the Prometheus Operator's kinds against its CRD models, and a
LeaderWorkerSet's pod templates against the PodTemplate schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests import (
    DEPLOY,
    is_component,
    kustomizations,
    pod_specs,
    rel,
    render,
    render_targets,
    stator_calls,
)

kv = pytest.importorskip("kubernetes_validate.utils", reason="pip install kubernetes-validate")

# The oldest Kubernetes the manifests claim (docs/deploy.md) and the newest schema known.
VERSIONS = ["1.29.0", kv.latest_version()]
TARGETS = render_targets()


def _missing(given, parsed, path="") -> list[str]:
    """Keys of `given` that did not survive parsing (a CRD model ignores unknown fields)."""
    if isinstance(given, dict):
        if not isinstance(parsed, dict):
            return [path or "."]
        out = []
        for k, v in given.items():
            out += [f"{path}.{k}"] if k not in parsed else _missing(v, parsed[k], f"{path}.{k}")
        return out
    if isinstance(given, list):
        if not isinstance(parsed, list) or len(parsed) != len(given):
            return [path]
        return [
            m
            for i, (g, p) in enumerate(zip(given, parsed, strict=True))
            for m in _missing(g, p, f"{path}[{i}]")
        ]
    return []


def _validate_crd(obj: dict) -> None:
    models = pytest.importorskip(
        "cloudcoil.models.prometheus_operator.v1",
        reason="pip install cloudcoil-models-prometheus-operator",
    )
    parsed = getattr(models, obj["kind"]).model_validate(obj)
    dumped = parsed.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert not _missing(obj, dumped), f"fields unknown to {obj['kind']}: {_missing(obj, dumped)}"


LWS_KEYS = {
    "spec": {"replicas", "leaderWorkerTemplate", "startupPolicy", "rolloutStrategy",
             "networkConfig"},
    "leaderWorkerTemplate": {"size", "restartPolicy", "leaderTemplate", "workerTemplate",
                             "subGroupPolicy"},
}  # fmt: skip


def _validate_lws(obj: dict, version: str) -> None:
    """LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): its own fields by name, its two pod
    templates as Kubernetes PodTemplates."""
    assert obj["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    spec = obj["spec"]
    assert set(spec) <= LWS_KEYS["spec"], set(spec) - LWS_KEYS["spec"]
    lwt = spec["leaderWorkerTemplate"]
    assert set(lwt) <= LWS_KEYS["leaderWorkerTemplate"], set(lwt) - LWS_KEYS["leaderWorkerTemplate"]
    assert isinstance(lwt["size"], int) and lwt["size"] >= 2
    assert lwt.get("restartPolicy", "RecreateGroupOnPodRestart") in (
        "RecreateGroupOnPodRestart", "None", "Default"
    )  # fmt: skip
    for name in ("leaderTemplate", "workerTemplate"):
        template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{obj['metadata']['name']}-{name}"},
            "template": lwt[name],
        }
        kv.validate(template, version, strict=True)


def validate(obj: dict, version: str) -> None:
    if obj["apiVersion"].startswith("monitoring.coreos.com/"):
        _validate_crd(obj)
    elif obj["kind"] == "LeaderWorkerSet":
        _validate_lws(obj, version)
    else:
        kv.validate(obj, version, strict=True)


@pytest.mark.parametrize("target", TARGETS, ids=rel)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_is_valid(target: Path, version: str):
    objects = render(target)
    assert objects, f"{rel(target)} renders nothing"
    failures = []
    for obj in objects:
        try:
            validate(obj, version)
        except Exception as exc:  # collect all, then fail once with every message
            failures.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc}")
    assert not failures, "\n".join(failures)


def test_strict_validation_rejects_an_unknown_field():
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x"},
        "data": {},
        "dataa": {},
    }
    with pytest.raises(kv.ValidationError):
        kv.validate(obj, VERSIONS[0], strict=True)
    monitor = yaml.safe_load((DEPLOY / "monitoring" / "podmonitor.yaml").read_text())
    monitor["spec"]["podMetricEndpoints"] = monitor["spec"].pop("podMetricsEndpoints")
    with pytest.raises(AssertionError, match="podMetricEndpoints"):
        _validate_crd(monitor)


def test_every_component_is_used_by_a_target():
    used = set()
    for target in TARGETS:
        doc = yaml.safe_load((target / "kustomization.yaml").read_text())
        used |= {(target / c).resolve() for c in doc.get("components", [])}
    unused = [rel(p) for p in kustomizations() if is_component(p) and p.resolve() not in used]
    assert not unused, f"components no overlay or recipe uses: {unused}"


@pytest.mark.parametrize("target", TARGETS, ids=rel)
def test_pods_run_as_non_root_with_resources_and_probes(target: Path):
    for obj in render(target):
        for where, spec in pod_specs(obj):
            name = f"{obj['kind']}/{obj['metadata']['name']} ({where})"
            assert spec.get("securityContext", {}).get("runAsNonRoot") is True, name
            for c in spec.get("containers", []):
                assert "memory" in c.get("resources", {}).get("limits", {}), f"{name}/{c['name']}"
                # Long-running servers have probes; Jobs and Ray followers do not serve.
                if obj["kind"] != "Job" and c.get("ports"):
                    assert "livenessProbe" in c and "readinessProbe" in c, f"{name}/{c['name']}"


def _recipe_dirs() -> list[Path]:
    return [p for p in TARGETS if p.is_relative_to(DEPLOY / "recipes")]


def test_recipes_cover_every_model_and_mode():
    names = {rel(p) for p in _recipe_dirs()}
    for model in ("llama-3.1-8b", "gpt-oss-20b", "gpt-oss-120b"):
        for mode in ("agg", "disagg"):
            assert f"recipes/{model}/{mode}" in names
    assert "recipes/llama-3.1-405b/multinode" in names


def test_multinode_worker_spans_nodes_with_vllm_over_ray():
    """The LeaderWorkerSet's parallelism matches its GPUs: TP x PP = GPUs per node x size."""
    [lws] = [
        o
        for o in render(DEPLOY / "recipes" / "llama-3.1-405b" / "multinode")
        if o["kind"] == "LeaderWorkerSet"
    ]
    template = lws["spec"]["leaderWorkerTemplate"]
    size = template["size"]
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    follower = template["workerTemplate"]["spec"]["containers"][0]
    gpus = int(leader["resources"]["limits"]["nvidia.com/gpu"])
    assert int(follower["resources"]["limits"]["nvidia.com/gpu"]) == gpus
    env = {e["name"]: e.get("value") for e in leader["env"]}
    assert int(env["GPUS_PER_NODE"]) == gpus
    [call] = [c for c in stator_calls(DEPLOY / "recipes" / "llama-3.1-405b" / "multinode")
              if c.subcommand == ["worker"]]  # fmt: skip
    assert call.flag_value("--engine") == "vllm"
    assert call.flag_value("--distributed-executor-backend") == "ray"
    tp = int(call.flag_value("--tensor-parallel-size"))
    pp = int(call.flag_value("--pipeline-parallel-size"))
    assert tp == gpus and tp * pp == gpus * size
    assert "$LWS_LEADER_ADDRESS:6379" in follower["args"][0]
    # No Deployment of aggregated workers is left beside it.
    kinds = [o["kind"] for o in render(DEPLOY / "recipes" / "llama-3.1-405b" / "multinode")
             if o["kind"] in ("Deployment", "LeaderWorkerSet")
             and o["metadata"]["name"].startswith("stator-worker")]  # fmt: skip
    assert kinds == ["LeaderWorkerSet"]


@pytest.mark.parametrize("target", _recipe_dirs(), ids=rel)
def test_recipe_workers_request_gpus_and_mount_the_cache_read_only(target: Path):
    gpu_pods = [
        spec
        for obj in render(target)
        for _, spec in pod_specs(obj)
        if any(c["name"] in ("worker", "ray-follower") for c in spec["containers"])
    ]
    assert gpu_pods
    for spec in gpu_pods:
        c = spec["containers"][0]
        assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["model-cache"]["readOnly"] is True
        assert "shm" in mounts
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HOME"].startswith("/model-cache")


@pytest.mark.parametrize("target", TARGETS, ids=rel)
def test_every_image_has_a_pinned_tag(target: Path):
    for obj in render(target):
        for _, spec in pod_specs(obj):
            for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                name, _, tag = c["image"].rpartition(":")
                assert name and tag and tag != "latest", f"{obj['metadata']['name']}: {c['image']}"
