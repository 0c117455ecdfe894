import math

import pytest

from stator.bench.client import RequestRecord
from stator.bench.metrics import meets, parse_slos, percentile, stats, summarize, tpot


def rec(i, ttft, latency, out=11, status=200, chunks=None, inp=100, cached=0):
    return RequestRecord(
        index=i,
        start=0.0,
        ttft=ttft,
        latency=latency,
        output_tokens=out,
        status=status,
        input_tokens=inp,
        cached_tokens=cached,
        chunk_times=chunks or [],
        error=None if status == 200 else "x",
    )


def test_parse_slos_units_and_errors():
    assert parse_slos("ttft=200ms, itl=25ms,e2e=2s") == {"ttft": 0.2, "itl": 0.025, "e2e": 2.0}
    assert parse_slos("ttft=150") == {"ttft": 0.15}
    assert parse_slos(None) == {}
    with pytest.raises(ValueError, match="bad SLO"):
        parse_slos("latency=3")
    with pytest.raises(ValueError):
        parse_slos("ttft=fast")


def test_percentile_matches_numpy_linear():
    values = sorted([5.0, 1.0, 3.0, 2.0, 4.0])
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(4.6)
    assert math.isnan(percentile([], 50))


def test_stats_scales_and_counts():
    s = stats([0.1, 0.2, 0.3], "ms", 1e3)
    assert s["count"] == 3 and s["avg"] == pytest.approx(200) and s["p50"] == pytest.approx(200)
    assert stats([], "ms") == {"unit": "ms", "count": 0}


def test_tpot_and_goodput():
    good = rec(0, 0.1, 1.1, out=11)  # 10 gaps over 1.0 s -> 100 ms per token
    assert tpot(good) == pytest.approx(0.1)
    assert meets(good, {"ttft": 0.2, "itl": 0.2})
    assert not meets(good, {"itl": 0.05})
    assert not meets(rec(1, 0.1, 1.1, status=503), {})


def test_summarize_counts_failures_against_goodput():
    records = [
        rec(0, 0.1, 1.1, chunks=[0.1, 0.2, 0.4], cached=50),
        rec(1, 0.3, 1.3, chunks=[0.3, 0.5]),
        rec(2, None, None, status=503, out=0),
    ]
    s = summarize(records, duration=2.0, slos={"ttft": 0.2})
    assert s["successful_requests"] == 2 and s["failed_requests"] == 1
    assert s["errors_by_status"] == {"503": 1}
    assert s["time_to_first_token"]["avg"] == pytest.approx(200)
    assert s["inter_chunk_latency"]["count"] == 3
    assert s["request_throughput"]["avg"] == pytest.approx(1.0)
    assert s["output_token_throughput"]["avg"] == pytest.approx(11.0)
    assert s["cached_token_ratio"]["avg"] == pytest.approx(0.25)
    assert s["goodput"]["good_requests"] == 1
    assert s["goodput"]["avg"] == pytest.approx(0.5)
