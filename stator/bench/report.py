"""Writing results: the summary table, summary JSON/CSV and per-request JSONL."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from stator.bench.runner import BenchResult, PointResult

TABLE_METRICS = [
    ("time_to_first_token", "TTFT (ms)"),
    ("time_to_second_token", "TTST (ms)"),
    ("inter_token_latency", "ITL/TPOT (ms)"),
    ("inter_chunk_latency", "chunk gap (ms)"),
    ("request_latency", "E2E latency (ms)"),
    ("output_token_throughput_per_user", "tok/s per user"),
    ("input_sequence_length", "ISL (tokens)"),
    ("output_sequence_length", "OSL (tokens)"),
]
SCALARS = [
    ("request_throughput", "requests/s"),
    ("output_token_throughput", "output tok/s"),
    ("total_token_throughput", "total tok/s"),
    ("cached_token_ratio", "cached token ratio"),
    ("goodput", "goodput (req/s)"),
    ("client_cpu_per_request", "client CPU ms/request"),
]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


def point_table(point: PointResult, title: str) -> Table:
    s = point.summary
    table = Table(title=f"{title} — {point.label}", title_justify="left")
    table.add_column("metric")
    for col in ("avg", "min", "p50", "p90", "p99", "max", "std"):
        table.add_column(col, justify="right")
    for key, name in TABLE_METRICS:
        row = s.get(key, {})
        if row.get("count"):
            table.add_row(
                name, *(_fmt(row.get(c)) for c in ("avg", "min", "p50", "p90", "p99", "max", "std"))
            )
    for key, name in SCALARS:
        if key in s:
            table.add_row(name, _fmt(s[key]["avg"]), *[""] * 6)
    table.add_row(
        "requests ok / failed", f"{s['successful_requests']} / {s['failed_requests']}", *[""] * 6
    )
    if s["errors_by_status"]:
        table.add_row("errors by status", json.dumps(s["errors_by_status"]), *[""] * 6)
    return table


def wide_console() -> Console:
    """A console that keeps tables readable when output goes to a file or pipe."""
    import sys

    return Console(width=None if sys.stdout.isatty() else 160)


def print_result(result: BenchResult, console: Console | None = None) -> None:
    console = console or wide_console()
    for point in result.points:
        console.print(point_table(point, f"{result.tag} ({result.model}, {result.endpoint})"))


def flat_row(point: PointResult) -> dict[str, Any]:
    """One CSV row: every statistic of a point as `metric_stat` columns."""
    row: dict[str, Any] = {"label": point.label, "mode": point.mode, "value": point.value}
    for key, value in point.summary.items():
        if isinstance(value, dict):
            for stat, v in value.items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    row[f"{key}_{stat}"] = v
        elif isinstance(value, int | float):
            row[key] = value
    return row


def write_outputs(result: BenchResult, out_dir: str | Path) -> list[Path]:
    """records.jsonl, summary.json (whole run: config + every point) and summary.csv."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with open(out / "records.jsonl", "wb") as f:
        enc = msgspec.json.Encoder()
        for point in result.points:
            for record in point.records:
                data = msgspec.structs.asdict(record)
                data["point"] = point.label
                data.pop("text", None)
                f.write(enc.encode(data) + b"\n")
    written.append(out / "records.jsonl")
    summary = {
        "tag": result.tag,
        "url": result.url,
        "model": result.model,
        "endpoint": result.endpoint,
        "config": result.config,
        "points": [
            {"label": p.label, "mode": p.mode, "value": p.value, **p.summary} for p in result.points
        ],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    written.append(out / "summary.json")
    rows = [flat_row(p) for p in result.points]
    fields = sorted(
        {k for r in rows for k in r}, key=lambda k: (k not in ("label", "mode", "value"), k)
    )
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    written.append(out / "summary.csv")
    return written
