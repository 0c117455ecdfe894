"""The global router with real processes: mocker pools of different speeds, each a
namespace, behind a frontend that embeds the global router (and, in the second test,
behind a standalone `stator global-router`). Requests with a tight TTFT target land in
the fast pool; killing that pool's workers (kill -9, mid-stream) moves requests to the
fallback pool with no failed request."""

from __future__ import annotations

import json
import re
import signal
import threading
import time

import httpx
import pytest

from tests.e2e.fleet import Fleet, wait_until

pytestmark = pytest.mark.integration

CONFIG = {
    "prefill_pool_namespaces": ["fast", "slow"],
    "prefill_pool_selection_strategy": {
        "isl_min": 0,
        "isl_max": 4096,
        "isl_resolution": 1,
        "ttft_min": 0,
        "ttft_max": 1000,
        "ttft_resolution": 2,
        "prefill_pool_mapping": [[0, 1]],
    },
}


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path)
    yield f
    f.close()


def completion(url: str, ttft: float, max_tokens: int = 12) -> dict:
    body = {"model": "tiny", "prompt": "hello pools", "max_tokens": max_tokens, "ignore_eos": True}
    headers = {"x-ttft-target": str(ttft)}
    resp = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()


def decisions(metrics_url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(metrics_url, timeout=5).text
    out = {}
    for line in text.splitlines():
        if line.startswith("stator_global_router_decisions_total{"):
            pool = re.search(r'[{,]pool="([^"]*)"', line).group(1)
            reason = re.search(r'reason="([^"]+)"', line).group(1)
            out[(pool, reason)] = float(line.rsplit(" ", 1)[1])
    return out


def pools(fleet: Fleet, discovery: str, events: str):
    fast = [
        fleet.mocker_worker(discovery, events, "--namespace", "fast", "--speedup-ratio", "20")
        for _ in range(2)
    ]
    slow = fleet.mocker_worker(discovery, events, "--namespace", "slow", "--speedup-ratio", "2")
    return fast, slow


def kill_mid_traffic(url: str, fast) -> list[str]:
    """Send tight-TTFT requests from two threads while the fast pool is killed; return
    every failure."""
    failures: list[str] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                usage = completion(url, ttft=50, max_tokens=24)["usage"]
                if usage["completion_tokens"] != 24:
                    failures.append(f"short completion: {usage}")
            except Exception as exc:  # every failure is the test's finding
                failures.append(repr(exc))

    threads = [threading.Thread(target=client) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    for proc in fast:
        proc.signal(signal.SIGKILL)
    time.sleep(4.0)  # past the discovery TTL (2 s): stale entries, then none
    stop.set()
    for t in threads:
        t.join(60)
    return failures


def test_embedded_global_router_picks_fast_pool_and_survives_its_death(fleet, tmp_path):
    discovery, events = f"file:{tmp_path / 'discovery'}", "zmq"
    config = tmp_path / "pools.json"
    config.write_text(json.dumps(CONFIG))
    frontend, url = fleet.frontend(discovery, events, "--global-router-config", str(config))
    fast, slow = pools(fleet, discovery, events)
    procs = [frontend, *fast, slow]

    def ready() -> bool:
        instances = httpx.get(f"{url}/health", timeout=5).json().get("instances", {})
        return len(instances.get("tiny", [])) == 3

    wait_until(ready, 90, "three workers in two pools", procs)
    for _ in range(3):
        completion(url, ttft=50)
    completion(url, ttft=900)
    seen = decisions(f"{url}/metrics")
    assert seen[("fast", "grid")] == 3
    assert seen[("slow", "grid")] == 1

    failures = kill_mid_traffic(url, fast)
    assert failures == []
    completion(url, ttft=50)
    seen = decisions(f"{url}/metrics")
    assert seen[("slow", "fallback")] >= 1


def test_standalone_global_router_behind_a_plain_frontend(fleet, tmp_path):
    discovery, events = f"file:{tmp_path / 'discovery'}", "zmq"
    config = tmp_path / "pools.yaml"
    import yaml

    config.write_text(yaml.safe_dump(CONFIG))
    frontend, url = fleet.frontend(discovery, events, "--namespace", "front")
    router = fleet.start(
        "global-router", "global-router", "--global-router-config", str(config),
        "--namespace", "front", "--discovery", discovery, "--event-plane", events,
        "--discovery-ttl", "2",
    )  # fmt: skip
    fast, slow = pools(fleet, discovery, events)
    procs = [frontend, router, *fast, slow]

    def served() -> bool:
        models = httpx.get(f"{url}/v1/models", timeout=5).json()["data"]
        return any(m["id"] == "tiny" for m in models)

    wait_until(served, 90, "the model through the global router", procs)
    # Wait until both pools have workers in the router (the model appears with the first).
    wait_until(lambda: completion(url, ttft=900) and True, 30, "a first answer", procs)
    assert kill_mid_traffic(url, fast) == []
    completion(url, ttft=50)


DISAGG = {
    "prefill_pool_namespaces": ["pf"],
    "decode_pool_namespaces": ["dec"],
    "prefill_pool_selection_strategy": {
        "isl_min": 0, "isl_max": 4096, "isl_resolution": 1,
        "ttft_min": 0, "ttft_max": 1000, "ttft_resolution": 1,
        "prefill_pool_mapping": [[0]],
    },
    "decode_pool_selection_strategy": {
        "context_length_min": 0, "context_length_max": 4096, "context_length_resolution": 1,
        "itl_min": 0, "itl_max": 100, "itl_resolution": 1,
        "decode_pool_mapping": [[0]],
    },
}  # fmt: skip


def metric_sum(metrics_url: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in httpx.get(metrics_url, timeout=5).text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_prefill_pool_and_decode_pool_disaggregate_by_the_disagg_protocol(fleet, tmp_path):
    """Real `--role prefill` and `--role decode` mocker workers in two pools: the prompt is
    computed in the prefill pool and the output generated in the decode pool (the
    disaggregation protocol of stator.router.disagg, across namespaces); when the prefill
    pool dies (kill -9) under traffic, decode workers prefill locally and nothing fails."""
    discovery, events = f"file:{tmp_path / 'discovery'}", "zmq"
    config = tmp_path / "pools.json"
    config.write_text(json.dumps(DISAGG))
    frontend, url = fleet.frontend(
        discovery, events, "--global-router-config", str(config),
        "--disagg-min-prefill-tokens", "0",  # the test's prompts are short
    )  # fmt: skip
    prefill = fleet.mocker_worker(
        discovery, events, "--namespace", "pf", "--role", "prefill", "--speedup-ratio", "10"
    )
    decodes = [
        fleet.mocker_worker(
            discovery, events, "--namespace", "dec", "--role", "decode", "--speedup-ratio", "10"
        )
        for _ in range(2)
    ]
    procs = [frontend, prefill, *decodes]
    metrics = f"{url}/metrics"

    def ready() -> bool:
        workers = "stator_global_router_pool_workers"
        return (
            metric_sum(metrics, workers, pool="pf", role="prefill") == 1
            and metric_sum(metrics, workers, pool="dec", role="serve") == 2
        )

    wait_until(ready, 90, "a prefill pool and a decode pool", procs)
    for _ in range(4):
        assert completion(url, ttft=100, max_tokens=16)["usage"]["completion_tokens"] == 16
    decided = metric_sum(
        metrics, "stator_global_router_decisions_total", stage="disagg", pool="dec",
        prefill_pool="pf",
    )  # fmt: skip
    assert decided == 4
    assert metric_sum(metrics, "stator_router_disagg_requests_total", path="remote") == 4

    assert kill_mid_traffic(url, [prefill]) == []
    completion(url, ttft=100)
    local = metric_sum(metrics, "stator_router_disagg_requests_total", path="local")
    assert local >= 1
