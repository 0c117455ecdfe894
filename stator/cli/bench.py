"""`stator bench run ...` (load test a server) and `stator bench compare A.json B.json`."""

from __future__ import annotations

import argparse

from stator.config import add_flags, from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    from stator.bench.config import BenchConfig

    bench = subparsers.add_parser(
        "bench", help="Measure an OpenAI-compatible server (TTFT, ITL, throughput, goodput)"
    )
    actions = bench.add_subparsers(dest="bench_command", metavar="ACTION")
    run = actions.add_parser(
        "run",
        help="Run a benchmark",
        description="Send a controlled load and report TTFT, ITL, throughput and goodput.",
    )
    add_flags(run, BenchConfig)
    run.set_defaults(func=_run)
    cmp = actions.add_parser("compare", help="Compare summary.json files of earlier runs")
    cmp.add_argument("summaries", nargs="+", help="summary.json files (the first is the baseline)")
    cmp.add_argument("--plot-dir", default=None, help="Draw comparison plots into this directory")
    cmp.set_defaults(func=_compare)
    bench.set_defaults(func=lambda args: bench.print_help() or 2)


def _run(args: argparse.Namespace) -> int:
    import asyncio

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from stator.bench.config import BenchConfig
    from stator.bench.metrics import parse_slos
    from stator.bench.progress import Batched
    from stator.bench.report import print_result, write_outputs
    from stator.bench.runner import _points, loop_factory, requests_per_point, run_benchmark

    cfg = from_args(BenchConfig, args)
    console = Console(stderr=True)
    try:
        parse_slos(cfg.slo)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    total = requests_per_point(cfg) * len(_points(cfg))
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not cfg.progress,
        refresh_per_second=2,
        transient=True,
    ) as progress:
        task = progress.add_task("requests", total=total)
        advance = Batched(lambda n: progress.advance(task, n))
        try:
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                result = runner.run(run_benchmark(cfg, advance))
        except (RuntimeError, ValueError, OSError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 1
        advance.flush()
    print_result(result)
    if cfg.out:
        files = write_outputs(result, cfg.out)
        if cfg.plots:
            from stator.bench.plots import draw_run  # (matplotlib: only when drawing)

            files += draw_run(result, cfg.out)
        console.print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from stator.bench.compare import compare

    try:
        files = compare(args.summaries, args.plot_dir)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    for f in files:
        print(f"wrote {f}")
    return 0
