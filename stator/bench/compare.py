"""`stator bench compare A.json B.json ...`: runs side by side, with ratios to the first."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from stator.bench.report import wide_console

ROWS = [
    ("request_throughput", "avg", "requests/s", True),
    ("output_token_throughput", "avg", "output tok/s", True),
    ("time_to_first_token", "p50", "TTFT p50 (ms)", False),
    ("time_to_first_token", "p90", "TTFT p90 (ms)", False),
    ("time_to_first_token", "p99", "TTFT p99 (ms)", False),
    ("inter_token_latency", "p50", "ITL p50 (ms)", False),
    ("inter_token_latency", "p90", "ITL p90 (ms)", False),
    ("request_latency", "p50", "E2E p50 (ms)", False),
    ("output_token_throughput_per_user", "p50", "tok/s/user p50", True),
    ("cached_token_ratio", "avg", "cached ratio", True),
    ("goodput", "avg", "goodput (req/s)", True),
    ("failed_requests", None, "failed requests", False),
]


def load_summary(path: str | Path) -> dict:
    data = json.loads(Path(path).read_text())
    if "points" not in data:
        raise ValueError(f"{path} is not a `stator bench` summary.json (no 'points')")
    data.setdefault("tag", Path(path).parent.name or str(path))
    return data


def _value(point: dict, key: str, stat: str | None) -> float | None:
    v = point.get(key)
    if v is None:
        return None
    if stat is None:
        return float(v)
    return v.get(stat) if isinstance(v, dict) else None


def compare_table(runs: list[dict]) -> list[Table]:
    """One table per load point label present in the first run."""
    tables = []
    base = runs[0]
    for i, point in enumerate(base["points"]):
        table = Table(title=f"point {point['label']}", title_justify="left")
        table.add_column("metric")
        for run in runs:
            table.add_column(run["tag"], justify="right")
        for other in runs[1:]:
            table.add_column(f"{other['tag']} / {base['tag']}", justify="right")
        for key, stat, name, _higher_better in ROWS:
            values = []
            for run in runs:
                pts = run["points"]
                values.append(_value(pts[i], key, stat) if i < len(pts) else None)
            if all(v is None for v in values):
                continue
            cells = ["-" if v is None else f"{v:,.2f}" for v in values]
            ratios = []
            for v in values[1:]:
                ok = v is not None and values[0] not in (None, 0)
                ratios.append(f"{v / values[0]:.2f}x" if ok else "-")
            table.add_row(name, *cells, *ratios)
        tables.append(table)
    return tables


def compare(
    paths: list[str], plot_dir: str | None = None, console: Console | None = None
) -> list[Path]:
    runs = [load_summary(p) for p in paths]
    console = console or wide_console()
    for table in compare_table(runs):
        console.print(table)
    if not plot_dir:
        return []
    from stator.bench.plots import runs_side_by_side, sweep_curves

    out = Path(plot_dir)
    out.mkdir(parents=True, exist_ok=True)
    series = [(r["tag"], r["points"]) for r in runs]
    return sweep_curves(series, out, prefix="compare_") + runs_side_by_side(series, out)
