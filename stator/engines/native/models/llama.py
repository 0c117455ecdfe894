"""Llama-style decoders (Llama 2/3, Mistral); Qwen2 and Qwen3 are variants of it.

Variants set class attributes instead of re-implementing layers: `qkv_bias` (Qwen2),
`qk_norm` (Qwen3: RMSNorm per head on q and k before RoPE). Parameter names mirror the
Hugging Face checkpoints except the fused `qkv_proj` and `gate_up_proj`, which
`packed_modules` maps (checkpoint name -> fused parameter, shard).
"""

from __future__ import annotations

import torch
from torch import nn

from stator.engines.native import epilogues
from stator.engines.native.attention import AttentionBackend
from stator.engines.native.config import ModelSpec
from stator.engines.native.context import get_context
from stator.engines.native.layers import GatedMLP, RMSNorm, RotaryEmbedding
from stator.engines.native.models.registry import register
from stator.engines.native.parallel_layers import (
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    gate_up_linear,
    qkv_linear,
)


class Attention(nn.Module):
    def __init__(
        self,
        spec: ModelSpec,
        backend: AttentionBackend,
        rotary: RotaryEmbedding,
        *,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm: bool,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = spec.num_heads, spec.num_kv_heads
        self.head_dim = spec.head_dim
        # `spec` is this rank's shard (sharding.shard_spec): its heads only.
        self.qkv_proj = qkv_linear(spec, qkv_bias)
        self.o_proj = RowParallelLinear(
            self.num_heads * self.head_dim, spec.hidden_size, spec.tp, bias=o_bias
        )
        self.q_norm = RMSNorm(self.head_dim, spec.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, spec.rms_norm_eps) if qk_norm else None
        self.rotary = rotary
        self.backend = backend
        self.scale = self.head_dim**-0.5
        # This layer's sliding window (None: the model's, 0: none) and attention sinks
        # ([Hq] logits, GPT-OSS); set by variants.
        self.window: int | None = None
        self.sinks: torch.Tensor | None = None
        # The paged cache of this layer, [num_blocks, block_size, Hkv, D]; set by the runner.
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        # Whether q/k/v's sum, RoPE and the KV store may run as one kernel on CUDA
        # (`epilogues.py`); set by the model class.
        self.fused_epilogues = False

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.project(positions, x)
        return self.o_proj(self.attend(q, k, v).flatten(1))

    def project(
        self, positions: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, Hq, D], k, v [T, Hkv, D] after RoPE, with k and v stored in the cache:
        everything before attention proper (piecewise graphs capture it, `piecewise.py`)."""
        if (
            self.fused_epilogues
            and self.q_norm is None
            and epilogues.active(x)
            and self.backend.stores_by_slot
        ):
            return self._project_fused(positions, x)
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        self.backend.store(k, v, self.k_cache, self.v_cache)
        return q, k, v

    def _project_fused(
        self, positions: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`project` as two kernels: the projection's partial sums, then one kernel that
        sums them, rotates q and k and stores k and v (`kernels/epilogues.py`)."""
        from stator.engines.native.kernels.epilogues import qkv_rope_store

        parts = epilogues.project(self.qkv_proj, x)
        qkv = qkv_rope_store(
            parts.data,
            parts.splits,
            parts.bias,
            self.num_heads,
            self.num_kv_heads,
            self.rotary.cos,
            self.rotary.sin,
            positions,
            get_context().slot_mapping,
            self.k_cache,
            self.v_cache,
            x.dtype,
        )
        q, k, v = qkv.split(self.qkv_proj.sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        return q, k, v.view(-1, self.num_kv_heads, self.head_dim)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[T, Hq, D]: attention over the cache (into `out` when given)."""
        return self.backend.attend(
            q,
            k,
            v,
            self.k_cache,
            self.v_cache,
            self.scale,
            window=self.window,
            sinks=self.sinks,
            out=out,
        )


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, attention: Attention, mlp: nn.Module | None = None):
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp or GatedMLP(
            gate_up_linear(spec),
            RowParallelLinear(spec.intermediate_size, spec.hidden_size, spec.tp, bias=False),
        )
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        # Whether the o and MLP projections' sums run inside the kernels that consume them
        # (`epilogues.py`); set by the model class. Another MLP (GPT-OSS's experts) hands
        # its finished output to the next norm's residual add.
        self.fused_epilogues = False

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor | epilogues.Parts,
        residual: torch.Tensor | None,
    ) -> tuple[torch.Tensor | epilogues.Parts, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it). The residual add is
        fused into the next norm: residual += x, then normalize (one kernel on CUDA). With
        fused epilogues x and the output may be a projection's unsummed `Parts`."""
        if isinstance(x, epilogues.Parts):  # the previous layer's fused down projection
            assert residual is not None
            h = epilogues.add_rms_norm(self.input_layernorm, x, residual)
            return self._forward_fused(positions, h, residual)
        if residual is None:
            residual = x
            h = self.input_layernorm(x)
        else:
            h = self.input_layernorm(x, residual)
        if self.fused_epilogues and epilogues.active(x):
            return self._forward_fused(positions, h, residual)
        h = self.post_attention_layernorm(self.self_attn(positions, h), residual)
        return self.mlp(h), residual

    def _forward_fused(
        self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor
    ) -> tuple[epilogues.Parts, torch.Tensor]:
        """From the normalized input h on: the o projection's sum in the post-attention
        norm's kernel, the gate/up's in SiLU-and-multiply's; the down projection's is left
        to the next norm."""
        attn = self.self_attn
        q, k, v = attn.project(positions, h)
        o = epilogues.project(attn.o_proj, attn.attend(q, k, v).flatten(1))
        h = epilogues.add_rms_norm(self.post_attention_layernorm, o, residual)
        if isinstance(self.mlp, GatedMLP):
            return epilogues.gated_mlp(self.mlp, h), residual
        return epilogues.Parts(self.mlp(h), 1, None), residual


class DecoderModel(nn.Module):
    def __init__(self, spec: ModelSpec, layers: list[DecoderLayer]) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, spec.tp)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        # EAGLE-3 heads read the residual stream entering these layers (spec/eagle.py);
        # the forward pass then leaves them in `aux_hidden`, [T, len(aux_layers) * H].
        self.aux_layers: tuple[int, ...] = ()
        self.aux_hidden: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        embeds = get_context().input_embeds
        if embeds is not None:  # prompt embeddings given in place of some tokens' lookups
            x = x.index_copy(0, embeds[0], embeds[1])
        residual = None
        aux: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            if i in self.aux_layers:
                if isinstance(x, epilogues.Parts):
                    x = x.tensor(residual.dtype)
                aux.append(x if residual is None else x + residual)
            x, residual = layer(positions, x, residual)
        if self.aux_layers:
            self.aux_hidden = torch.cat(aux, dim=-1)
        if isinstance(x, epilogues.Parts):
            return epilogues.add_rms_norm(self.norm, x, residual)
        return self.norm(x, residual)


@register("LlamaForCausalLM", "MistralForCausalLM")
class LlamaForCausalLM(nn.Module):
    qkv_bias: bool | None = None  # None: follow config.json's `attention_bias`
    o_bias: bool | None = None
    qk_norm = False
    supports_prompt_embeds = True
    # Mixed steps may run as piecewise CUDA graphs (`piecewise.py`): a dense MLP, nothing
    # with a host sync or a data-dependent shape between two attentions.
    piecewise_graphs = True
    # Compile every kernel variant of mixed and prefill steps at start-up (kernel_warmup.py):
    # without it the first step whose prompts were all <= 16 tokens compiled the extend
    # kernel's 16-row tile on the serving path (an 8B-shaped H100 run, ShareGPT-like: 254
    # decodes + 16 prompt tokens took 534 ms, its neighbours ~20; 2026-11-28).
    kernel_warmup = True

    #: checkpoint module name -> (fused module name, shard)
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, spec: ModelSpec, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__()
        self.spec = spec
        act = spec.raw.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(
                f"{spec.architecture}: hidden_act {act!r} is not supported (silu only)"
            )
        if spec.raw.get("mlp_bias"):
            raise ValueError(f"{spec.architecture}: mlp_bias=true is not supported")
        rotary = RotaryEmbedding(spec.head_dim, max_positions, spec.rope_theta, spec.rope_scaling)
        qkv_bias = spec.attention_bias if self.qkv_bias is None else self.qkv_bias
        o_bias = spec.attention_bias if self.o_bias is None else self.o_bias
        layers = [
            DecoderLayer(
                spec,
                Attention(
                    spec, backend, rotary, qkv_bias=qkv_bias, o_bias=o_bias, qk_norm=self.qk_norm
                ),
            )
            for _ in range(spec.num_layers)
        ]
        for layer in layers:  # dense Llama-family layers: fused epilogues on CUDA
            layer.fused_epilogues = layer.self_attn.fused_epilogues = True
            attn, mlp = layer.self_attn, layer.mlp
            if not self.qk_norm:
                attn.qkv_proj.epilogue = "parts"
            attn.o_proj.epilogue = mlp.down_proj.epilogue = "parts"
            mlp.gate_up_proj.epilogue = "gated"
        self.model = DecoderModel(spec, layers)
        self.lm_head = ParallelLMHead(spec.vocab_size, spec.hidden_size, spec.tp)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Final hidden states [T, hidden] for the flattened batch of the current step."""
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn for layer in self.model.layers]
