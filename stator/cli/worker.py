"""`stator worker`: serve one model with one engine as a worker process.

The engine is chosen by `--engine NAME` (native, mocker, vllm, ...) or, for your own
backend, `--engine package.module:factory`, where `factory(config, model_path,
served_name)` returns a `stator.engines.base.Engine`; if the factory has a `config_class`
attribute (a dataclass in the `stator.config` idiom), its fields become flags too.

Flags come in two phases: the first parse finds `--engine`; the chosen engine's config
class then contributes its own flags (listed by `stator worker --engine NAME --help`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stator.config import add_flags, from_args, option
from stator.engines.base import Engine
from stator.runtime import RuntimeConfig
from stator.worker.config import WorkerConfig
from stator.worker.model_resolution import DownloadConfig, ModelNotFound, resolve_model

log = logging.getLogger(__name__)

DESCRIPTION = "Serve a model with an engine as a worker process."
EPILOG = (
    "Custom engines: --engine package.module:factory, where factory(config, model_path, "
    "served_name) returns an Engine; a factory.config_class dataclass adds its flags. "
    "Show an engine's flags with: stator worker --engine NAME --help"
)
DOWNLOAD_FLAGS_SKIPPED = frozenset({"allow_patterns", "ignore_patterns"})


@dataclasses.dataclass
class EngineChoice:
    engine: str = option(
        "native", "Engine: native | mocker | vllm | package.module:factory", metavar="ENGINE"
    )


@dataclasses.dataclass
class EngineSpec:
    """A chosen engine: its config class (None: no flags) and its factory."""

    name: str
    config_class: type | None
    factory: Callable[[Any, str, str], Engine]


def load_engine_spec(name: str) -> EngineSpec:
    """`name` is a registered engine or `module:factory`; ValueError says what is wrong."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"cannot load engine factory {name!r}: {exc}") from exc
        if not callable(factory):
            raise ValueError(f"engine factory {name!r} is not callable")
        return EngineSpec(name, getattr(factory, "config_class", None), factory)
    from stator.engines import registry

    config_class = registry.engine_config_class(name)

    def factory(config: Any, model_path: str, served_name: str) -> Engine:
        return registry.create_engine(name, config, model_path, served_name)

    return EngineSpec(name, config_class, factory)


def _phase_one_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "worker",
        help=DESCRIPTION,
        description=DESCRIPTION,
        epilog=EPILOG,
        add_help=False,
        allow_abbrev=False,
    )
    _add_common_flags(parser)
    return parser


def _add_common_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Flags of every worker, whatever its engine. Returns their field names."""
    parser.add_argument("-h", "--help", action="store_true", help="Show this help and exit")
    add_flags(parser.add_argument_group("engine"), EngineChoice)
    add_flags(parser.add_argument_group("worker"), WorkerConfig)
    add_flags(
        parser.add_argument_group("model download"), DownloadConfig, skip=DOWNLOAD_FLAGS_SKIPPED
    )
    add_flags(parser.add_argument_group("runtime"), RuntimeConfig)
    names = {"help"}
    for cls in (EngineChoice, WorkerConfig, DownloadConfig, RuntimeConfig):
        names |= {f.name for f in dataclasses.fields(cls)}
    return names


def full_parser(spec: EngineSpec | None, prog: str = "stator worker") -> argparse.ArgumentParser:
    """Every flag of `stator worker` with this engine: for --help and the second parse."""
    parser = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, epilog=EPILOG, add_help=False, allow_abbrev=False
    )
    common = _add_common_flags(parser)
    if spec is not None and spec.config_class is not None:
        group = parser.add_argument_group(f"{spec.name} engine")
        add_flags(group, spec.config_class, skip=common)
        # An engine with flags of its own library (vLLM's engine arguments) adds them here.
        passthrough = getattr(spec.config_class, "add_passthrough_flags", None)
        if passthrough is not None:
            passthrough(parser)
    return parser


def register(subparsers: Any) -> None:
    parser = _phase_one_parser(subparsers)
    parser.set_defaults(func=run, accepts_unknown=True)


def second_phase(
    args: argparse.Namespace,
    full_parser: Callable[[EngineSpec | None], argparse.ArgumentParser],
) -> tuple[EngineSpec, argparse.Namespace] | int:
    """Load the engine named by `--engine`, then parse the flags the first phase did not
    know (the engine's own) with `full_parser(spec)`. Returns (spec, all parsed flags), or
    the exit code when there is nothing to serve (`--help`, or an engine that won't load)."""
    try:
        spec = load_engine_spec(args.engine)
    except ValueError as exc:
        if args.help:  # help works even when the chosen engine cannot load here
            full_parser(None).print_help()
            log.warning("no engine flags shown: %s", exc)
            return 0
        log.error("%s", exc)
        return 2
    parser = full_parser(spec)
    if args.help:
        parser.print_help()
        return 0
    unknown = list(getattr(args, "unknown_args", []) or [])
    return spec, parser.parse_args(unknown, namespace=argparse.Namespace(**vars(args)))


def run(args: argparse.Namespace) -> int:
    phase = second_phase(args, full_parser)
    if isinstance(phase, int):
        return phase
    spec, engine_args = phase
    engine_config = build_engine_config(spec, engine_args)
    runtime_config = from_args(RuntimeConfig, engine_args)
    worker_config = from_args(WorkerConfig, engine_args)
    download = from_args(DownloadConfig, engine_args)
    try:
        model_dir = worker_model_dir(worker_config, download)
    except ModelNotFound as exc:
        log.error("%s", exc)
        return 2
    served = worker_config.served_name(model_dir)
    engine_config = engine_config_for_role(engine_config, worker_config.role)
    try:
        engine = spec.factory(engine_config, str(model_dir), served)
    except Exception as exc:
        log.error("cannot create the %s engine: %s: %s", spec.name, type(exc).__name__, exc)
        return 1
    from stator.worker.main import serve_worker

    return asyncio.run(serve_worker(runtime_config, worker_config, engine, model_dir))


def build_engine_config(spec: EngineSpec, namespace: argparse.Namespace) -> Any:
    """The engine's config; a config class with `from_namespace` also reads its
    pass-through flags from the namespace."""
    if spec.config_class is None:
        return None
    from_namespace = getattr(spec.config_class, "from_namespace", None)
    if from_namespace is not None:
        return from_namespace(namespace)
    return from_args(spec.config_class, namespace)


def engine_config_for_role(config: Any, role: str) -> Any:
    """The engine's config for a worker of `role`: the native engine's core runs in the
    worker's process for the prefill and decode roles (their KV transfer agent needs the
    cache at hand) unless told otherwise."""
    if config is None or not dataclasses.is_dataclass(config):
        return config
    if role != "aggregated" and getattr(config, "engine_core_process", None) == "auto":
        config = dataclasses.replace(config, engine_core_process="off")
    return config


def worker_model_dir(config: WorkerConfig, download: DownloadConfig) -> Path:
    if not config.model:
        from stator.models import bundled_model_dir

        try:
            return bundled_model_dir()
        except FileNotFoundError as exc:
            raise ModelNotFound(f"{exc}; pass --model") from exc
    return resolve_model(config.model, revision=download.revision, cache_dir=download.cache_dir)


__all__ = [
    "build_engine_config",
    "engine_config_for_role",
    "full_parser",
    "load_engine_spec",
    "register",
    "run",
    "second_phase",
    "worker_model_dir",
]
