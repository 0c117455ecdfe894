"""PNG plots: latency distributions of a run, curves over a sweep, and several runs
overlaid (for `stator bench compare`). matplotlib with the non-interactive Agg backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from stator.bench.metrics import tpot
from stator.bench.runner import BenchResult


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def distributions(result: BenchResult, out: Path) -> list[Path]:
    """Histograms of TTFT and ITL (per-request TPOT and chunk gaps) for every point."""
    files = []
    for name, values_of, xlabel in (
        (
            "ttft",
            lambda p: [r.ttft * 1e3 for r in p.records if r.ok and r.ttft is not None],
            "TTFT (ms)",
        ),
        (
            "itl",
            lambda p: [t * 1e3 for r in p.records if r.ok and (t := tpot(r)) is not None],
            "ITL per request (ms)",
        ),
    ):
        fig, ax = plt.subplots(figsize=(7, 4))
        drawn = False
        for point in result.points:
            values = values_of(point)
            if values:
                ax.hist(values, bins=40, alpha=0.6, label=point.label)
                drawn = True
        if not drawn:
            plt.close(fig)
            continue
        ax.set_xlabel(xlabel)
        ax.set_ylabel("requests")
        ax.set_title(f"{xlabel} — {result.tag}")
        ax.legend()
        files.append(_save(fig, out / f"{name}_distribution.png"))
    return files


def _series(summary_points: list[dict], key: str, stat: str = "avg") -> list[float]:
    return [p.get(key, {}).get(stat, float("nan")) for p in summary_points]


def sweep_curves(runs: list[tuple[str, list[dict]]], out: Path, prefix: str = "") -> list[Path]:
    """Throughput and latency vs the swept variable, and the Pareto curve of tok/s per
    user vs total tok/s; `runs` = [(name, summary points)]."""
    if not runs or all(len(points) < 2 for _, points in runs):
        return []
    xlabel = runs[0][1][0]["mode"]
    files = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in runs:
        ax.plot(
            [p["value"] for p in points],
            _series(points, "output_token_throughput"),
            "o-",
            label=name,
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel("output tok/s")
    ax.set_title("Throughput")
    ax.legend()
    files.append(_save(fig, out / f"{prefix}throughput_vs_{xlabel}.png"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, points in runs:
        xs = [p["value"] for p in points]
        for ax, key, label in (
            (axes[0], "time_to_first_token", "TTFT"),
            (axes[1], "inter_token_latency", "ITL"),
        ):
            ax.plot(xs, _series(points, key, "p50"), "o-", label=f"{name} p50")
            ax.plot(xs, _series(points, key, "p90"), "x--", label=f"{name} p90")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{label} (ms)")
            ax.set_title(label)
    axes[0].legend()
    files.append(_save(fig, out / f"{prefix}latency_vs_{xlabel}.png"))

    fig, ax = plt.subplots(figsize=(6, 5))
    for name, points in runs:
        ax.plot(
            _series(points, "output_token_throughput_per_user", "p50"),
            _series(points, "output_token_throughput"),
            "o-",
            label=name,
        )
        for p in points:
            ax.annotate(
                f"{p['value']:g}",
                (
                    p.get("output_token_throughput_per_user", {}).get("p50", 0),
                    p["output_token_throughput"]["avg"],
                ),
                fontsize=7,
            )
    ax.set_xlabel("tok/s per user (p50)")
    ax.set_ylabel("output tok/s (total)")
    ax.set_title("Pareto: interactivity vs throughput")
    ax.legend()
    files.append(_save(fig, out / f"{prefix}pareto.png"))
    return files


def draw_run(result: BenchResult, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = distributions(result, out)
    points = [
        {"label": p.label, "mode": p.mode, "value": p.value, **p.summary} for p in result.points
    ]
    files += sweep_curves([(result.tag, points)], out)
    return files


def runs_side_by_side(runs: list[tuple[str, list[dict]]], out: Path) -> list[Path]:
    """Bars of the headline numbers of each run's first point (runs without a sweep)."""
    panels = [
        ("output_token_throughput", "avg", "output tok/s"),
        ("time_to_first_token", "p50", "TTFT p50 (ms)"),
        ("time_to_first_token", "p90", "TTFT p90 (ms)"),
        ("inter_token_latency", "p50", "ITL p50 (ms)"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4))
    names = [name for name, _ in runs]
    for ax, (key, stat, label) in zip(axes, panels, strict=True):
        values = [points[0].get(key, {}).get(stat, float("nan")) for _, points in runs]
        ax.bar(range(len(names)), values, color=[f"C{i}" for i in range(len(names))])
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        ax.set_title(label)
    return [_save(fig, out / "compare_runs.png")]
