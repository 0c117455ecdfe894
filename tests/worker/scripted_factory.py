"""A custom-engine factory for `stator worker --engine tests.worker.scripted_factory:create`:
serves tests/fakes.py's ScriptedEngine (a test double, not an engine for users)."""

from __future__ import annotations

from dataclasses import dataclass

from stator.config import option
from tests.fakes import ScriptedEngine


@dataclass
class ScriptedConfig:
    token_delay: float = option(0.0, "Seconds between tokens")
    script: list[int] | None = option(None, "Tokens to stream (default: echo the prompt)")


def create(config: ScriptedConfig | None, model_path: str, served_name: str) -> ScriptedEngine:
    config = config or ScriptedConfig()
    return ScriptedEngine(
        served_name, script=config.script, delay=config.token_delay, source_path=model_path
    )


create.config_class = ScriptedConfig
