"""`stator bench` against a real `stator run --engine mocker`: every load shape, its
numbers checked against the server's own metrics, and every output file."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import httpx
import pytest

from stator.bench.compare import compare
from stator.bench.config import BenchConfig
from stator.bench.plots import draw_run
from stator.bench.report import write_outputs
from stator.bench.runner import run_benchmark
from tests.e2e.fleet import BUNDLED, Fleet, wait_until
from tests.procs import REPO, repo_env

pytestmark = pytest.mark.integration
TOKENIZER = str(BUNDLED)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    fleet = Fleet(tmp_path_factory.mktemp("bench-server"))
    proc = fleet.start(
        "run", "run", "--engine", "mocker", "--workers", "1", "--speedup-ratio", "4",
        "--block-size", "16", "--port", "0",
    )  # fmt: skip
    found = {}

    def ready() -> bool:
        m = re.search(r"at (http://\S+)/v1", proc.output())
        if m:
            found["url"] = m.group(1)
        return bool(m)

    wait_until(ready, 120, "stator run", [proc])
    yield found["url"]
    fleet.close()


def metric_sums(url: str) -> dict[str, float]:
    """Sum every sample of each metric family (labels folded)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0]
        if name == "stator_frontend_requests_total" and 'status="200"' not in name_labels:
            continue
        if name == "stator_frontend_requests_total" and "chat" not in name_labels:
            continue
        out[name] = out.get(name, 0.0) + float(value)
    return out


def bench(url: str, **kw) -> object:
    cfg = BenchConfig(url=url, tokenizer=TOKENIZER, progress=False, **kw)
    return asyncio.run(run_benchmark(cfg))


def delta(after: dict, before: dict, name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def test_closed_loop_numbers_match_the_servers_metrics(server):
    before = metric_sums(server)
    result = bench(server, concurrency=4, num_requests=16, isl=64, osl=8, slo="ttft=5s")
    after = metric_sums(server)
    (point,) = result.points
    s = point.summary
    assert s["successful_requests"] == 16 and s["failed_requests"] == 0
    assert all(r.output_tokens == 8 for r in point.records)
    assert delta(after, before, "stator_frontend_requests_total") == 16
    assert delta(after, before, "stator_frontend_output_tokens_sum") == 16 * 8
    assert delta(after, before, "stator_frontend_input_tokens_sum") == sum(
        r.input_tokens for r in point.records
    )
    assert delta(after, before, "stator_frontend_cached_tokens_total") == sum(
        r.cached_tokens for r in point.records
    )
    # The client's TTFT is the server's plus the trip through HTTP: never less, not much more.
    server_ttft = delta(after, before, "stator_frontend_time_to_first_token_seconds_sum") / 16
    client_ttft = s["time_to_first_token"]["avg"] / 1e3
    assert server_ttft * 0.8 <= client_ttft <= server_ttft + 0.05
    server_e2e = delta(after, before, "stator_frontend_request_duration_seconds_sum") / 16
    assert s["request_latency"]["avg"] / 1e3 == pytest.approx(server_e2e, rel=0.3, abs=0.05)
    assert s["goodput"]["good_requests"] == 16
    assert s["output_token_throughput"]["avg"] == pytest.approx(16 * 8 / point.duration, rel=1e-6)


def test_open_loop_rates_follow_their_schedule(server):
    for arrival in ("poisson", "constant", "gamma"):
        result = bench(
            server,
            request_rate=40.0,
            arrival=arrival,
            burstiness=0.5,
            num_requests=12,
            isl=32,
            osl=4,
        )
        (point,) = result.points
        assert point.summary["successful_requests"] == 12
        starts = sorted(r.start for r in point.records)
        assert starts[-1] > 0.05  # spread over time, not a burst
        if arrival == "constant":
            # 12 sends 25 ms apart: the last leaves 275 ms after the first (none early).
            assert starts[-1] - starts[0] >= 0.27


def test_trace_replay_reuses_prefixes_and_keeps_time(server, tmp_path):
    rows = [
        {"timestamp": 0, "input_length": 96, "output_length": 4, "hash_ids": [7, 8, 9]},
        {"timestamp": 200, "input_length": 96, "output_length": 4, "hash_ids": [7, 8, 10]},
        {"timestamp": 400, "input_length": 64, "output_length": 4, "hash_ids": [7, 8]},
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    result = bench(server, trace=str(trace), trace_block_size=32, time_scale=1.0, num_requests=0)
    (point,) = result.points
    records = sorted(point.records, key=lambda r: r.index)
    assert [r.ok for r in records] == [True] * 3
    assert records[2].start - records[0].start >= 0.38
    assert records[1].cached_tokens >= 48 and records[2].cached_tokens >= 48


def test_sessions_grow_and_sweeps_make_points(server, tmp_path):
    result = bench(server, sessions=2, turns=3, isl=24, osl=6)
    (point,) = result.points
    assert len(point.records) == 6
    by_turn = {r.turn: r.input_tokens for r in point.records if r.session == 0}
    assert by_turn[0] < by_turn[1] < by_turn[2]

    sweep = bench(server, sweep=[1, 4], num_requests=8, isl=32, osl=4, slo="ttft=10s")
    assert [p.label for p in sweep.points] == ["concurrency=1", "concurrency=4"]
    files = write_outputs(sweep, tmp_path / "a") + draw_run(sweep, tmp_path / "a")
    names = {f.name for f in files}
    assert {
        "records.jsonl",
        "summary.json",
        "summary.csv",
        "ttft_distribution.png",
        "pareto.png",
        "throughput_vs_concurrency.png",
    } <= names
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    for key in (
        "time_to_first_token",
        "inter_token_latency",
        "request_latency",
        "output_token_throughput",
        "request_throughput",
        "goodput",
        "client_cpu_per_request",
    ):
        assert key in summary["points"][0]
    cpu = summary["points"][0]["client_cpu_per_request"]
    assert cpu["unit"] == "ms" and cpu["avg"] == pytest.approx(cpu["user"] + cpu["system"])
    assert cpu["system"] >= 0 and 0 < cpu["avg"] < 1000  # some work, not seconds per request
    assert len((tmp_path / "a" / "records.jsonl").read_text().splitlines()) == 16
    write_outputs(sweep, tmp_path / "b")
    plots = compare(
        [str(tmp_path / "a" / "summary.json"), str(tmp_path / "b" / "summary.json")],
        plot_dir=str(tmp_path / "cmp"),
    )
    assert plots and all(p.exists() for p in plots)


def test_cli_run_and_errors(server, tmp_path):
    out = tmp_path / "cli"
    cmd = [
        sys.executable,
        "-m",
        "stator",
        "bench",
        "run",
        "--url",
        server,
        "--num-requests",
        "4",
        "--isl",
        "16",
        "--osl",
        "4",
        "--no-progress",
        "--out",
        str(out),
        "--tokenizer",
        TOKENIZER,
    ]
    done = subprocess.run(
        cmd, env=repo_env(), cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "TTFT" in done.stdout and (out / "summary.json").exists()
    # With the (batched) progress bar, on uvloop: same result, its own CPU in the table.
    shown = subprocess.run(
        [c for c in cmd if c != "--no-progress"],
        env=repo_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "client CPU ms/request" in shown.stdout
    assert json.loads((out / "summary.json").read_text())["points"][0]["successful_requests"] == 4
    bad = subprocess.run(
        [*cmd, "--slo", "latency=3"],
        env=repo_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "bad SLO" in bad.stderr
    # A context overflow is a counted rejection, not a crash.
    result = bench(server, num_requests=3, isl=2000, osl=4)
    assert result.points[0].summary["errors_by_status"] == {"400": 3}
