"""The per-token histogram reads like prometheus_client's own."""

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from stator.frontend.metrics import FastHistogram


def test_token_histogram_matches_prometheus_histogram():
    buckets = (0.001, 0.01, 0.1)
    ours = FastHistogram("itl_seconds", "gaps", "model", buckets)
    ours_registry = CollectorRegistry()
    ours_registry.register(ours)
    theirs_registry = CollectorRegistry()
    theirs = Histogram("itl_seconds", "gaps", ["model"], buckets=buckets, registry=theirs_registry)
    values = [0.0005, 0.001, 0.002, 0.01, 0.05, 0.1, 0.5, 3.0]
    for model in ("a", "b/c"):
        series = ours.labels(model)
        for v in values:
            series.observe(v)
            theirs.labels(model).observe(v)
    ours_lines = sorted(
        line
        for line in generate_latest(ours_registry).decode().splitlines()
        if "created" not in line
    )
    theirs_lines = sorted(
        line
        for line in generate_latest(theirs_registry).decode().splitlines()
        if "created" not in line
    )
    assert ours_lines == theirs_lines
