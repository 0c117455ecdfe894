"""`VllmConfig`: stator's own flags for the vLLM engine, plus vLLM's engine arguments.

`stator worker --engine vllm` takes two kinds of flags: the fields below (stator's, with
STATOR_* env twins) and every `AsyncEngineArgs` flag of vLLM, passed through untouched.
vLLM flags that stator already owns (`--model`, `--served-model-name`, `--revision`) are
stator's: the worker resolves the model and names it.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from stator.config import from_args, option

# vLLM flags whose stator twin wins (same meaning, already on `stator worker`).
OWNED_BY_STATOR = frozenset({"-h", "--help", "--model", "--served-model-name", "--revision"})
# Namespace attribute listing the dests of the vLLM flags grafted onto the parser.
GRAFTED = "_vllm_engine_arg_dests"


@dataclass
class VllmConfig:
    kv_events: bool = option(
        True, "Relay vLLM's KV cache events (ZMQ publisher on a free loopback port)"
    )
    engine_monitor_interval: float = option(
        2.0, "Seconds between vLLM engine health checks; a dead engine stops the worker"
    )
    default_max_loras: int = option(
        4,
        "max_loras to use when --enable-lora is given without --max-loras; one slot is "
        "always kept free (see the LoRA note in stator.engines.vllm.lora)",
    )
    connector: list[str] = option(
        [],
        "KV connectors to build vLLM's kv_transfer_config from, comma-separated, chained in "
        "order with MultiConnector: offload (vLLM's CPU offloading, --kv-offloading-size GiB, "
        "default 8), lmcache, nixl, kvbm, none; a prefill or decode role's connector leads "
        "the chain (a --kv-transfer-config of your own wins)",
    )
    # vLLM `AsyncEngineArgs` fields given on the command line (name -> value); only the
    # ones that differ from vLLM's defaults. Not a flag of its own: see `from_namespace`.
    engine_args: dict[str, Any] = dataclasses.field(default_factory=dict, init=False)

    @classmethod
    def make(cls, engine_args: dict[str, Any] | None = None, **fields: Any) -> VllmConfig:
        """For library users and tests: `VllmConfig.make({"max_model_len": 512})`."""
        config = cls(**fields)
        config.engine_args = dict(engine_args or {})
        return config

    # -- the two hooks `stator worker` calls for pass-through flags ----------------------

    @staticmethod
    def add_passthrough_flags(parser: argparse.ArgumentParser) -> None:
        """Graft vLLM's engine-argument flags onto `parser` (for --help and parsing)."""
        group = parser.add_argument_group("vLLM engine arguments (passed to AsyncEngineArgs)")
        taken = set(parser._option_string_actions)
        grafted = []
        for action in _vllm_actions():
            if any(s in OWNED_BY_STATOR or s in taken for s in action.option_strings):
                continue  # stator's flag of the same name wins (e.g. --reasoning-parser)
            if not action.option_strings:  # vLLM's positional model tag
                continue
            group._add_action(action)
            grafted.append(action.dest)
        parser.set_defaults(**{GRAFTED: grafted})

    @classmethod
    def from_namespace(cls, namespace: argparse.Namespace) -> VllmConfig:
        """Stator fields from their flags; vLLM fields that differ from vLLM's defaults."""
        config = from_args(cls, namespace)
        grafted = set(getattr(namespace, GRAFTED, ()))
        defaults = {a.dest: a.default for a in _vllm_actions() if a.dest in grafted}
        fields = {f.name for f in dataclasses.fields(_engine_args_class())}
        config.engine_args = {
            dest: getattr(namespace, dest)
            for dest, default in defaults.items()
            if dest in fields and hasattr(namespace, dest) and getattr(namespace, dest) != default
        }
        # vLLM's --max-model-len is the worker's own flag (it sets the card too).
        if getattr(namespace, "max_model_len", 0):
            config.engine_args["max_model_len"] = namespace.max_model_len
        return config


def _engine_args_class() -> type:
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs


def _vllm_actions() -> list[argparse.Action]:
    """vLLM's own parser's actions (built fresh: argparse actions belong to one parser)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(add_help=False)
    _engine_args_class().add_cli_args(parser)
    return [a for a in parser._actions if a.dest != "help"]
