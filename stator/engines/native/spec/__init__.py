"""Speculative decoding: draft methods behind one interface (prompt lookup, a draft model,
EAGLE-3 heads), verification by rejection sampling, acceptance metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stator.engines.native.spec.config import SpeculativeConfig
from stator.engines.native.spec.decoder import SpecDecoder, SpecStats

if TYPE_CHECKING:
    from stator.engines.native.engine_core import EngineCore


def make_spec_decoder(core: EngineCore) -> SpecDecoder | None:
    """The core's speculative decoder from `--speculative-config`, or None when off."""
    config = SpeculativeConfig.parse(core.config.speculative_config)
    if config is None:
        return None
    if core.config.tensor_parallel_size != 1:
        raise ValueError("speculative decoding runs on one device (--tensor-parallel-size 1)")
    model = None
    if config.method == "draft_model":
        from stator.engines.native.spec.draft_model import DraftModelProposer

        model = DraftModelProposer(
            config.model,  # type: ignore[arg-type]
            core.config,
            core.spec,
            core.runner.num_blocks,
            core.max_model_len,
            core.sampler,
        )
    elif config.method == "eagle3":
        from stator.engines.native.spec.eagle import Eagle3Proposer

        model = Eagle3Proposer(config.model, core)  # type: ignore[arg-type]
    return SpecDecoder(config, core.sampler, model)


__all__ = ["SpecDecoder", "SpecStats", "SpeculativeConfig", "make_spec_decoder"]
