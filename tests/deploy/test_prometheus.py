"""Every dashboard query and alert rule against a real Prometheus (the Debian package)
scraping a real `stator frontend` and two `stator worker --engine mocker` processes
(one prefill, one decode) and a `stator planner` under a
short load: each dashboard query returns data, every rule evaluates without error (and each
recording rule returns data), through Prometheus's HTTP API."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests import DEPLOY
from tests.procs import free_port, stator_process, wait_healthy

httpx = pytest.importorskip("httpx")
pytestmark = [pytest.mark.integration, pytest.mark.slow]

RULES = DEPLOY / "monitoring" / "alerts.rules.yaml"
# Grafana's $__rate_interval; the whole load fits in this window.
RATE_WINDOW = "1m"


def _generator():
    path = DEPLOY / "monitoring" / "generate.py"
    spec = importlib.util.spec_from_file_location("stator_dashboard", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        assert proc.poll() is None, f"{proc.args} exited early with code {proc.returncode}"
        assert time.monotonic() < deadline, f"{url} never answered 200"
        time.sleep(0.3)


@contextlib.contextmanager
def _processes() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _load(base: str) -> None:
    """A short mixed load: streamed chats sharing a prefix (so that the KV router finds
    cached blocks), plus one request for an unknown model (404) and one invalid (400)."""
    prefix = "You are a helpful assistant. " * 20
    with httpx.Client(base_url=base, timeout=60) as http:
        for i in range(24):
            body = {
                "model": "stator-tiny",
                "messages": [{"role": "user", "content": f"{prefix} question {i % 6}"}],
                "max_tokens": 16,
                "stream": True,
            }
            with http.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                for _ in r.iter_lines():
                    pass
        r = http.post("/v1/chat/completions", json={**body, "model": "no-such-model"})
        assert r.status_code == 404
        r = http.post("/v1/chat/completions", json={**body, "max_tokens": -1})
        assert r.status_code == 400


def _query(prom: str, expr: str) -> dict:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    return body["data"]


def test_dashboard_queries_and_rules_on_a_real_prometheus(tmp_path: Path):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus not installed (apt-get install prometheus; .ci/run does)")
    discovery = f"file:{tmp_path / 'discovery'}"
    http_port, prom_port = free_port(), free_port()
    worker_ports = [free_port(), free_port()]
    with _processes() as procs:
        # One prefill and one decode worker: the disaggregation panels need both roles.
        for port, role in zip(worker_ports, ("prefill", "decode"), strict=True):
            procs.append(
                stator_process(
                    "worker",
                    "--role",
                    role,
                    "--kv-transfer",
                    "tcp",
                    "--engine",
                    "mocker",
                    "--served-model-name",
                    "stator-tiny",
                    "--discovery",
                    discovery,
                    "--system-port",
                    str(port),
                    "--num-gpu-blocks",
                    "512",
                    "--block-size",
                    "16",
                    "--speedup-ratio",
                    "20",
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        frontend = stator_process(
            "frontend", "--discovery", discovery, "--http-port", str(http_port),
            "--router-mode", "kv", "--disagg-min-prefill-tokens", "0",
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        procs.append(frontend)
        for port, proc in zip(worker_ports, procs, strict=False):
            _wait_http(f"http://127.0.0.1:{port}/health", proc)
        wait_healthy(frontend, http_port)
        # A planner (load policy, applying nothing) for the Planner row; started once the
        # frontend answers, so that its first reads already see traffic.
        planner_port = free_port()
        procs.append(
            stator_process(
                "planner",
                "--policy",
                "load",
                "--connector",
                "none",
                "--roles",
                "prefill,decode",
                "--discovery",
                discovery,
                "--frontend-url",
                f"http://127.0.0.1:{http_port}",
                "--adjustment-interval",
                "1",
                "--metrics-port",
                str(planner_port),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": "stator-frontend",
                    "static_configs": [{"targets": [f"127.0.0.1:{http_port}"]}],
                },
                {
                    "job_name": "stator-worker",
                    "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in worker_ports]}],
                },
                {
                    "job_name": "stator-planner",
                    "static_configs": [{"targets": [f"127.0.0.1:{planner_port}"]}],
                },
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom_proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(prom_proc)
        prom = f"http://127.0.0.1:{prom_port}"
        _wait_http(f"{prom}/-/ready", prom_proc)

        # Prometheus syncs its scrape targets every 5 s: wait until all three are scraped.
        deadline = time.monotonic() + 30
        while True:
            targets = httpx.get(f"{prom}/api/v1/targets", timeout=10).json()["data"]
            health = {t["scrapeUrl"]: t["health"] for t in targets["activeTargets"]}
            if len(health) == 4 and set(health.values()) == {"up"}:
                break
            assert time.monotonic() < deadline, f"targets not all up: {health}"
            time.sleep(0.5)

        _load(f"http://127.0.0.1:{http_port}")
        time.sleep(4)  # a few scrapes and rule evaluations after the load

        empty = []
        for expr in _generator().queries():
            data = _query(prom, expr.replace("$__rate_interval", RATE_WINDOW))
            if not data["result"]:
                empty.append(expr)
        assert not empty, "dashboard queries without data:\n" + "\n".join(empty)

        deadline = time.monotonic() + 20
        while True:
            groups = httpx.get(f"{prom}/api/v1/rules", timeout=10).json()["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            if rules and all(r.get("lastEvaluation", "").startswith("2") for r in rules):
                break
            assert time.monotonic() < deadline, "rules were never evaluated"
            time.sleep(0.5)
        expected = yaml.safe_load(RULES.read_text())["groups"]
        assert len(rules) == sum(len(g["rules"]) for g in expected)
        bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
        assert not bad, f"rules that failed to evaluate: {bad}"
        for g in expected:
            for rule in g["rules"]:
                data = _query(prom, rule["expr"])
                if "record" in rule:
                    assert data["result"], f"recording rule {rule['record']} has no data"
                    assert _query(prom, rule["record"])["result"], rule["record"]
