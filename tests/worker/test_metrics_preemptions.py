"""`stator_worker_preemptions_total`: the engine's `preemptions_total` as a counter."""

from __future__ import annotations

from prometheus_client import generate_latest

from stator.protocols import LoadReport
from stator.worker.metrics import PREEMPTIONS, WorkerMetrics


def _text(extra: dict) -> str:
    load = [LoadReport(worker_id=1, dp_rank=0, active_kv_blocks=1, total_kv_blocks=4)]
    metrics = WorkerMetrics("m", lambda: load, lambda: extra)
    return generate_latest(metrics.registry).decode()


def test_preemptions_become_a_counter_not_an_engine_gauge():
    text = _text({PREEMPTIONS: 3, "mocker_active_blocks": 1})
    assert "# TYPE stator_worker_preemptions_total counter" in text
    assert 'stator_worker_preemptions_total{model="m"} 3.0' in text
    assert "stator_worker_engine_preemptions_total" not in text
    assert 'stator_worker_engine_mocker_active_blocks{model="m"} 1.0' in text


def test_engines_without_the_count_have_no_series():
    assert "stator_worker_preemptions_total" not in _text({})
