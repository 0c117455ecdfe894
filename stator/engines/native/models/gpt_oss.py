"""GPT-OSS (20B, 120B): a decoder whose attention has biases, one learned sink logit per
query head and a sliding window of `sliding_window` keys on the layers `layer_types` marks
`sliding_attention`; YaRN rotary embeddings (layers.py); and a mixture of experts
(models/moe.py) in place of the MLP.

Checkpoints come in two layouts: the published one (experts in MXFP4: `*_blocks`,
`*_scales`) and the bf16 one transformers writes (`gate_up_proj` [E, H, 2I], `down_proj`
[E, I, H], inputs first). `map_checkpoint` turns both into this model's expert tensors
(this rank's experts only, gate and up rows de-interleaved, outputs first).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from stator.engines.native import mxfp4
from stator.engines.native.attention import AttentionBackend
from stator.engines.native.config import ModelSpec
from stator.engines.native.layers import RotaryEmbedding
from stator.engines.native.models.llama import Attention, DecoderLayer, DecoderModel
from stator.engines.native.models.moe import MoE
from stator.engines.native.models.registry import register
from stator.engines.native.parallel_layers import ParallelLMHead
from stator.engines.native.sharding import read_all

_EXPERTS = re.compile(r"^(.*\.mlp)\.experts\.(gate_up_proj|down_proj)(_blocks|_scales|_bias|)$")


def _deinterleave(w: torch.Tensor) -> torch.Tensor:
    """Rows (dim 1) g0 u0 g1 u1 ... -> g0 g1 ... u0 u1 ..."""
    return torch.cat([w[:, 0::2], w[:, 1::2]], dim=1)


def checkpoint_is_mxfp4(model_dir: str | Path) -> bool:
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = json.loads(index.read_text())["weight_map"]
    else:
        names = []
        for path in sorted(model_dir.glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                names.extend(f.keys())
    return any(name.endswith("_blocks") for name in names)


def resolve_moe_weights(choice: str, model_dir: str | Path, device: str, dummy: bool) -> bool:
    """Whether experts are held packed (MXFP4). auto: packed on CUDA when the checkpoint
    is (random weights stand for the published checkpoint, which is MXFP4)."""
    is_mxfp4 = dummy or checkpoint_is_mxfp4(model_dir)
    if choice == "mxfp4" and not is_mxfp4:
        raise ValueError(
            "--moe-weights mxfp4 needs an MXFP4 checkpoint (experts as *_blocks/*_scales); "
            f"{model_dir} holds bf16 experts: use --moe-weights bf16"
        )
    if choice == "auto":
        return is_mxfp4 and device == "cuda"
    return choice == "mxfp4"


class SinkAttention(Attention):
    def __init__(self, spec: ModelSpec, backend: AttentionBackend, rotary, window: int):
        super().__init__(spec, backend, rotary, qkv_bias=True, o_bias=True, qk_norm=False)
        self.window = window
        # Float32 whatever the model dtype: the kernels add them in float32.
        self.sinks = nn.Parameter(torch.empty(spec.num_heads, dtype=torch.float32))
        self.sinks.weight_loader = self._load_sinks  # type: ignore[attr-defined]
        self._heads = spec.tp.block(spec.num_heads)

    def _load_sinks(self, param: nn.Parameter, loaded: Any, shard: Any = None) -> None:
        part = read_all(loaded)[self._heads]
        if part.shape != param.shape:
            raise ValueError(f"sinks: shape {tuple(part.shape)} != {tuple(param.shape)}")
        param.data.copy_(part)


@register("GptOssForCausalLM")
class GptOssForCausalLM(nn.Module):
    # No piecewise CUDA graphs for mixed steps (`piecewise.py`): the split ran and matched
    # eager on an H100 (the router, the one-launch expert sort and the grouped GEMMs have
    # no host sync), but 1,000 ShareGPT-like requests at c=256 through HTTP measured 6,466
    # output tok/s with them against 7,658 with mixed steps eager (2026-11-27, one call;
    # the first run may also have paid Triton compiles the second found cached). At that
    # load most mixed steps exceed the 512-token limit and are GPU-bound anyway.
    piecewise_graphs = False
    # Compile every kernel variant of eager steps at start-up (kernel_warmup.py): the first
    # serve ran at 0.52x the second with the MoE's buckets compiled on the serving path.
    kernel_warmup = True
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
    }

    def __init__(
        self, spec: ModelSpec, backend: AttentionBackend, max_positions: int, packed: bool = False
    ) -> None:
        super().__init__()
        self.spec = spec
        rotary = RotaryEmbedding(spec.head_dim, max_positions, spec.rope_theta, spec.rope_scaling)
        windows = spec.layer_windows or [spec.sliding_window or 0] * spec.num_layers
        layers = [
            DecoderLayer(spec, SinkAttention(spec, backend, rotary, windows[i]), MoE(spec, packed))
            for i in range(spec.num_layers)
        ]
        for layer in layers:
            # Fused epilogues on CUDA (`epilogues.py`), as the dense Llama layers: q/k/v's
            # split-K sums in the RoPE + KV store kernel, o's in the residual add + norm,
            # the router's in the routing kernel (models/moe.py). H100, 20B, batch-1 decode
            # 405.2 tok/s against 393.8 without (2026-11-28, same process): 288 kernels a
            # step against 336; q/k/v leave cuBLAS (13 us a call), whose one launch had
            # beaten the GEMV with its sum kernel.
            layer.fused_epilogues = layer.self_attn.fused_epilogues = True
            attn = layer.self_attn
            attn.qkv_proj.epilogue = attn.o_proj.epilogue = layer.mlp.router.epilogue = "parts"
        self.model = DecoderModel(spec, layers)
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size, spec.tp)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn for layer in self.model.layers]

    def moe_layers(self) -> list[MoE]:
        return [layer.mlp for layer in self.model.layers]

    def warmup_token_counts(self) -> list[int]:
        """Token counts where the MoE's kernels change (kernel_warmup.py)."""
        from stator.engines.native.kernels.fused_moe import token_boundaries

        return token_boundaries(self.spec.experts_per_token)

    def map_checkpoint(self, tensors: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """Checkpoint expert tensors -> this model's (see the module docstring)."""
        moe = self.moe_layers()[0]
        first, count = moe.first, moe.local
        device, dtype = moe.b13.device, moe.b13.dtype
        pending: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
        for name, tensor in tensors:
            match = _EXPERTS.match(name)
            if match is None:
                yield name, tensor
                continue
            prefix, proj, kind = match.groups()
            short = "w13" if proj == "gate_up_proj" else "w2"
            fix = _deinterleave if short == "w13" else (lambda w: w)
            local = tensor[first : first + count]  # this rank's experts only
            if kind == "_bias":
                yield f"{prefix}.b{short[1:]}", fix(local)
            elif kind == "":  # transformers' bf16 layout, inputs first
                if moe.packed:
                    raise ValueError(f"{name}: --moe-weights mxfp4 needs MXFP4 experts; use bf16")
                yield f"{prefix}.{short}", fix(local.transpose(1, 2))
            elif moe.packed:
                yield f"{prefix}.{short}{kind}", fix(local)
            else:
                parts = pending.setdefault((prefix, short), {})
                parts[kind] = local.to(device)
                if len(parts) == 2:
                    del pending[(prefix, short)]
                    w = mxfp4.dequantize(parts["_blocks"], parts["_scales"], dtype)
                    yield f"{prefix}.{short}", fix(w)
        if pending:
            raise ValueError(f"MXFP4 experts without their blocks or scales: {list(pending)}")


__all__ = ["GptOssForCausalLM", "resolve_moe_weights"]
