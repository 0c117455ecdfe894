"""Owns the model and its paged KV cache on one device: builds a step's flat inputs from
the scheduled batch, runs the forward pass and returns the logits the engine asked for."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from stator.engines.native.attention import AttentionBackend, TorchAttention
from stator.engines.native.config import ModelSpec, NativeConfig, parse_bytes
from stator.engines.native.context import StepContext, set_context
from stator.engines.native.loader import load_weights
from stator.engines.native.models import model_class
from stator.engines.native.request import Sequence

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CPU_DEFAULT_KV_BYTES = 1 << 30


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available")
    return torch.device(name)


def resolve_dtype(name: str, spec: ModelSpec, device: torch.device) -> torch.dtype:
    if name == "auto":
        # Half-precision matmuls are slow on most CPUs; the checkpoint's dtype on GPUs.
        return torch.float32 if device.type == "cpu" else DTYPES[spec.checkpoint_dtype]
    return DTYPES[name]


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    ctx: StepContext
    logits_rows: torch.Tensor  # rows of the hidden states to turn into logits


class ModelRunner:
    def __init__(
        self,
        spec: ModelSpec,
        config: NativeConfig,
        model_dir: str | Path,
        max_model_len: int,
        backend: AttentionBackend | None = None,
    ) -> None:
        self.spec = spec
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, spec, self.device)
        self.block_size = config.block_size
        if config.cpu_threads > 0:
            torch.set_num_threads(config.cpu_threads)
        self.backend = backend or TorchAttention()
        self.sliding_window = spec.sliding_window
        cls = model_class(spec.architecture)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                self.model = cls(spec, self.backend, max_model_len)
        finally:
            torch.set_default_dtype(previous)
        load_weights(self.model, model_dir)
        self.model.eval()
        self.num_blocks = self._size_kv_cache(max_model_len)
        shape = (self.num_blocks, self.block_size, spec.num_kv_heads, spec.head_dim)
        for layer in self.model.attention_layers():
            # Zeroed, not empty: padded gathers read unused slots and must see finite values.
            layer.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            layer.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)

    def bytes_per_block(self) -> int:
        s = self.spec
        elem = torch.finfo(self.dtype).bits // 8
        return 2 * s.num_layers * self.block_size * s.num_kv_heads * s.head_dim * elem

    def _size_kv_cache(self, max_model_len: int) -> int:
        per_block = self.bytes_per_block()
        if self.config.kv_cache_memory:
            budget = parse_bytes(self.config.kv_cache_memory)
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = int(free - total * (1.0 - self.config.gpu_memory_utilization))
        else:
            budget = _CPU_DEFAULT_KV_BYTES
        num_blocks = budget // per_block
        if not self.config.kv_cache_memory:
            # No point holding more than every sequence at full length.
            useful = self.config.max_num_seqs * -(-max_model_len // self.block_size)
            num_blocks = min(num_blocks, useful)
        if num_blocks < 1:
            raise ValueError(
                f"the KV cache budget ({budget} bytes) is smaller than one block "
                f"({per_block} bytes); raise --kv-cache-memory or --gpu-memory-utilization"
            )
        log.info(
            "KV cache: %d blocks of %d tokens (%d bytes each)",
            num_blocks,
            self.block_size,
            per_block,
        )
        return num_blocks

    # -- one step ------------------------------------------------------------------------

    def prepare(
        self, seqs: list[Sequence], num_new: list[int], logits_rows: list[int]
    ) -> StepInputs:
        """Flatten the batch. Sequence i computes tokens [computed, computed + num_new[i])."""
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        bs = self.block_size
        for seq, n in zip(seqs, num_new, strict=True):
            start = seq.num_computed_tokens
            input_ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            table = seq.block_ids
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
        width = max(len(s.block_ids) for s in seqs)
        tables = [s.block_ids + [0] * (width - len(s.block_ids)) for s in seqs]
        seq_lens = [s.num_computed_tokens + n for s, n in zip(seqs, num_new, strict=True)]
        dev = self.device
        query_lens = torch.tensor(num_new, dtype=torch.long)
        cu = torch.zeros(len(seqs) + 1, dtype=torch.long)
        torch.cumsum(query_lens, 0, out=cu[1:])
        ctx = StepContext(
            positions=torch.tensor(positions, dtype=torch.long).to(dev, non_blocking=True),
            slot_mapping=torch.tensor(slots, dtype=torch.long).to(dev, non_blocking=True),
            block_tables=torch.tensor(tables, dtype=torch.long).to(dev, non_blocking=True),
            query_lens=query_lens.to(dev, non_blocking=True),
            seq_lens=torch.tensor(seq_lens, dtype=torch.long).to(dev, non_blocking=True),
            cu_query_lens=cu.to(dev, non_blocking=True),
            max_query_len=max(num_new),
            max_seq_len=max(seq_lens),
            block_size=bs,
            uniform=len(set(num_new)) == 1 and len(set(seq_lens)) == 1,
        )
        return StepInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.long).to(dev, non_blocking=True),
            ctx=ctx,
            logits_rows=torch.tensor(logits_rows, dtype=torch.long).to(dev, non_blocking=True),
        )

    @torch.inference_mode()
    def execute(self, inputs: StepInputs) -> torch.Tensor:
        """Run the model; logits [len(logits_rows), vocab] in float32."""
        self.backend.plan(inputs.ctx, self.sliding_window)
        set_context(inputs.ctx)
        try:
            hidden = self.model(inputs.input_ids, inputs.ctx.positions)
        finally:
            set_context(None)
        return self.model.compute_logits(hidden[inputs.logits_rows]).float()
