"""`stator profile`: measure one worker's engine (prefill TTFT vs ISL, decode ITL vs batch
and context, throughput per GPU) and write the profile the planner and the mocker read.

    stator profile --engine native --model Qwen/Qwen3-0.6B --output qwen.json
    stator worker --engine mocker --model Qwen/Qwen3-0.6B --profile qwen.json   # calibrated

Takes the same engine flags as `stator worker --engine NAME`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from stator.config import add_flags, from_args

log = logging.getLogger(__name__)


def _add_profile_flags(parser: argparse.ArgumentParser) -> None:
    from stator.planner.profiler import ProfileConfig

    add_flags(parser.add_argument_group("profile"), ProfileConfig)


def register(subparsers: Any) -> None:
    from stator.cli.worker import _add_common_flags

    parser = subparsers.add_parser(
        "profile",
        help="Measure an engine's prefill and decode curves for the planner and the mocker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
        allow_abbrev=False,
    )
    _add_common_flags(parser)
    _add_profile_flags(parser)
    parser.set_defaults(func=run, accepts_unknown=True)


def _full_parser(spec) -> argparse.ArgumentParser:
    from stator.cli.worker import full_parser

    parser = full_parser(spec, prog="stator profile")
    _add_profile_flags(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from stator.cli.worker import build_engine_config, second_phase, worker_model_dir
    from stator.planner.profiler import ProfileConfig, Profiler, plot_profile
    from stator.worker.config import WorkerConfig
    from stator.worker.model_resolution import DownloadConfig, ModelNotFound

    phase = second_phase(args, _full_parser)
    if isinstance(phase, int):
        return phase
    spec, ns = phase
    config = from_args(ProfileConfig, ns)
    try:
        config.validate()
        model_dir = worker_model_dir(from_args(WorkerConfig, ns), from_args(DownloadConfig, ns))
    except (ValueError, ModelNotFound) as exc:
        log.error("%s", exc)
        return 2
    served = from_args(WorkerConfig, ns).served_name(model_dir)
    engine = spec.factory(build_engine_config(spec, ns), str(model_dir), served)
    vocab = _vocab_size(model_dir)

    async def main() -> int:
        await engine.start()
        try:
            profile = await Profiler(engine, config, vocab).run()
        finally:
            await engine.shutdown()
        profile.save(config.output)
        plot = config.plot or str(Path(config.output).with_suffix(".png"))
        plot_profile(profile, plot)
        log.info("wrote %s and %s", config.output, plot)
        return 0

    return asyncio.run(main())


def _vocab_size(model_dir: Path) -> int:
    try:
        return int(json.loads((model_dir / "config.json").read_text()).get("vocab_size", 32000))
    except (OSError, ValueError):
        return 32000
