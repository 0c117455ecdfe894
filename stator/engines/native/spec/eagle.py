"""EAGLE-3 heads: a one-layer drafter that reads the target's own hidden states.

Checkpoint format (as EAGLE-3 releases ship them, e.g. `EAGLE3-LLaMA3.1-Instruct-8B`):
`config.json` (hidden_size, heads, intermediate_size, `draft_vocab_size`, optionally
`eagle_aux_hidden_state_layer_ids`) and weights `fc.weight` [H, 3H], `midlayer.*` (one
Llama decoder layer whose attention reads [embedding; hidden] of width 2H, plus
`midlayer.hidden_norm`), `norm.weight`, `lm_head.weight` [draft_vocab, H], and `d2t`
(draft id -> target id offset). The token embedding is the target's.

How it drafts: the target's forward pass leaves the residual stream entering three layers
(by default 2, L/2 and L-3) for every token it computes; `fc` folds them into one hidden
state per position, kept per sequence until the head has read it. The head's input at
position p is (embedding of token p + 1, hidden of position p); it predicts token p + 2.
A step's first pass catches up over every position the target has verified since the last
one (target hidden states); each further pass feeds the draft just made with the head's
own output hidden state. The head's KV cache (one layer) shares the target's block tables,
as a draft model's does (draft_model.py), and positions drafted on its own hidden states
are recomputed from the target's once verified.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from stator.engines.native.context import set_context
from stator.engines.native.layers import RotaryEmbedding
from stator.engines.native.request import Sequence

if TYPE_CHECKING:
    from stator.engines.native.engine_core import EngineCore


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * h.to(x.dtype)).to(x.dtype)


class Eagle3Head(nn.Module):
    def __init__(self, cfg: dict, target_hidden: int, num_aux: int, max_positions: int) -> None:
        super().__init__()
        h = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.kv_heads = int(cfg.get("num_key_value_heads") or self.heads)
        self.head_dim = int(cfg.get("head_dim") or h // self.heads)
        self.eps = float(cfg.get("rms_norm_eps", 1e-5))
        inter = int(cfg["intermediate_size"])
        vocab = int(cfg.get("draft_vocab_size") or cfg["vocab_size"])
        self.fc = nn.Linear(num_aux * target_hidden, h, bias=False)
        self.hidden_norm = nn.Parameter(torch.ones(h))
        self.input_layernorm = nn.Parameter(torch.ones(h))
        self.post_attention_layernorm = nn.Parameter(torch.ones(h))
        self.q_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)
        self.norm = nn.Parameter(torch.ones(h))
        self.lm_head = nn.Linear(h, vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(vocab, dtype=torch.long))
        rope = cfg.get("rope_scaling") or None
        if rope is not None and rope.get("rope_type", rope.get("type")) in (None, "default"):
            rope = None
        self.rotary = RotaryEmbedding(
            self.head_dim, max_positions, float(cfg.get("rope_theta", 10000.0)), rope
        )
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.backend = None  # the target's attention backend, set by the proposer

    # Checkpoint name -> attribute of this module.
    NAMES = {
        "fc.weight": "fc.weight",
        "midlayer.hidden_norm.weight": "hidden_norm",
        "midlayer.input_layernorm.weight": "input_layernorm",
        "midlayer.post_attention_layernorm.weight": "post_attention_layernorm",
        "midlayer.self_attn.q_proj.weight": "q_proj.weight",
        "midlayer.self_attn.k_proj.weight": "k_proj.weight",
        "midlayer.self_attn.v_proj.weight": "v_proj.weight",
        "midlayer.self_attn.o_proj.weight": "o_proj.weight",
        "midlayer.mlp.gate_proj.weight": "gate_proj.weight",
        "midlayer.mlp.up_proj.weight": "up_proj.weight",
        "midlayer.mlp.down_proj.weight": "down_proj.weight",
        "norm.weight": "norm",
        "lm_head.weight": "lm_head.weight",
        "d2t": "d2t",
    }

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        params = dict(self.named_parameters()) | dict(self.named_buffers())
        missing = [n for n in self.NAMES if n not in weights and n != "d2t"]
        if missing:
            raise ValueError(f"EAGLE-3 checkpoint lacks {missing}")
        with torch.no_grad():
            for name, attr in self.NAMES.items():
                if name in weights:
                    target = params[attr]
                    value = weights[name]
                    if tuple(value.shape) != tuple(target.shape):
                        raise ValueError(
                            f"EAGLE-3 weight {name}: shape {tuple(value.shape)}, "
                            f"expected {tuple(target.shape)}"
                        )
                    target.copy_(value.to(target.dtype))

    def forward(
        self, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits over the draft vocabulary, the output hidden state fed to the next
        pass), per token."""
        x = torch.cat(
            [
                _rms(embeds, self.input_layernorm, self.eps),
                _rms(hidden, self.hidden_norm, self.eps),
            ],
            dim=-1,
        )
        q = self.q_proj(x).view(-1, self.heads, self.head_dim)
        k = self.k_proj(x).view(-1, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(-1, self.kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k)
        assert self.backend is not None
        self.backend.store(k, v, self.k_cache, self.v_cache)
        attn = self.backend.attend(q, k, v, self.k_cache, self.v_cache, self.head_dim**-0.5)
        h = hidden + self.o_proj(attn.flatten(1))
        m = _rms(h, self.post_attention_layernorm, self.eps)
        h = h + self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))
        return self.lm_head(_rms(h, self.norm, self.eps)), h


def load_eagle3_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        out: dict[str, torch.Tensor] = {}
        for f in files:
            out.update(load_file(str(f)))
        return out
    bin_file = model_dir / "pytorch_model.bin"
    if bin_file.is_file():
        return torch.load(bin_file, map_location="cpu", weights_only=True)
    raise ValueError(f"{model_dir} has no *.safetensors or pytorch_model.bin")


class _View:
    """What `ModelRunner.prepare` reads of a sequence, with the head's own progress."""

    __slots__ = ("block_ids", "num_computed_tokens", "token_ids")
    prompt_embeds = None
    num_prompt_tokens = 0

    def __init__(self, seq: Sequence, computed: int) -> None:
        self.token_ids = seq.token_ids
        self.block_ids = seq.block_ids
        self.num_computed_tokens = computed


class Eagle3Proposer:
    def __init__(self, model_dir: str | Path, core: EngineCore) -> None:
        model_dir = Path(model_dir)
        cfg = json.loads((model_dir / "config.json").read_text())
        target = core.runner.model
        inner = getattr(target, "model", None)
        if inner is None or not hasattr(inner, "aux_layers"):
            raise ValueError(f"{core.spec.architecture} cannot feed an EAGLE-3 head")
        layers = core.spec.num_layers
        aux = cfg.get("eagle_aux_hidden_state_layer_ids") or (2, layers // 2, layers - 3)
        inner.aux_layers = tuple(int(i) for i in aux)
        if int(cfg.get("vocab_size", core.spec.vocab_size)) != core.spec.vocab_size:
            raise ValueError("the EAGLE-3 head was trained for another vocabulary")
        self.core = core
        self.runner = core.runner
        # The head needs the hidden states of every target step: no decode graphs.
        self.runner.graphs = None
        dev, dtype = self.runner.device, self.runner.dtype
        with torch.device(dev):
            head = Eagle3Head(cfg, core.spec.hidden_size, len(inner.aux_layers), core.max_model_len)
        head.load(load_eagle3_weights(model_dir))
        self.head = head.to(dtype=dtype)
        self.head.d2t = self.head.d2t.long()
        self.head.backend = self.runner.backend
        shape = (self.runner.num_blocks, self.runner.block_size, head.kv_heads, head.head_dim)
        self.head.k_cache = torch.zeros(shape, dtype=dtype, device=dev)
        self.head.v_cache = torch.zeros(shape, dtype=dtype, device=dev)
        self.embed = inner.embed_tokens
        self.vocab = core.spec.vocab_size
        self.draft_ids = torch.arange(self.head.lm_head.out_features, device=dev) + self.head.d2t
        # request id -> (first position, fc'd target hidden states from there on)
        self._hidden: dict[str, tuple[int, torch.Tensor]] = {}

    # -- after each target step ----------------------------------------------------------

    @torch.inference_mode()
    def observe(self, seqs: list[Sequence], starts: list[int], num_new: list[int]) -> None:
        """Keep the target hidden states of the positions each sequence just computed
        (after any rollback: only up to its `num_computed_tokens`)."""
        aux = self.runner.model.model.aux_hidden
        if aux is None:
            return
        folded = self.head.fc(aux.to(self.head.fc.weight.dtype))
        offset = 0
        for seq, start, n in zip(seqs, starts, num_new, strict=True):
            valid = min(n, seq.num_computed_tokens - start)
            if valid > 0:
                rows = folded[offset : offset + valid]
                kept = self._hidden.get(seq.request_id)
                if kept is not None and kept[0] + kept[1].shape[0] == start:
                    self._hidden[seq.request_id] = (kept[0], torch.cat([kept[1], rows]))
                else:  # the first rows, or after a gap (preemption, prefix-cache hit)
                    self._hidden[seq.request_id] = (start, rows.clone())
            offset += n

    # -- drafting ------------------------------------------------------------------------

    def forget(self, request_id: str) -> None:
        self._hidden.pop(request_id, None)

    def keep_only(self, request_ids: set[str]) -> None:
        for rid in [r for r in self._hidden if r not in request_ids]:
            del self._hidden[rid]

    @torch.inference_mode()
    def propose(
        self, seqs: list[Sequence], ks: list[int], starts: list[int]
    ) -> list[torch.Tensor | None]:
        sampler = self.core.sampler
        views, new, inputs_hidden, token_rows = [], [], [], []
        usable = []
        for seq, start in zip(seqs, starts, strict=True):
            kept = self._hidden.get(seq.request_id)
            last = start - 1  # the last real token: its target hidden state is not known
            if kept is None or kept[0] >= last or kept[0] + kept[1].shape[0] < last:
                usable.append(False)
                continue
            first = kept[0]
            usable.append(True)
            views.append(_View(seq, first))
            new.append(last - first)
            inputs_hidden.append(kept[1][: last - first])
            # Input at position p is token p + 1.
            token_rows.append(seq.token_ids[first + 1 : last + 1])
            # What the next step catches up from: this step's drafts are redone.
            self._hidden[seq.request_id] = (last, kept[1][last - first :])
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        live = [i for i, ok in enumerate(usable) if ok]
        for i, ok in enumerate(usable):
            if not ok:  # no hidden states to draft from: placeholders, rejected at once
                for j in range(ks[i]):
                    seqs[i].token_ids[starts[i] + j] = seqs[i].token_ids[starts[i] - 1]
        if not live:
            return [None] * len(seqs)
        ids = torch.tensor([t for rows in token_rows for t in rows], dtype=torch.long)
        hidden = torch.cat(inputs_hidden)
        cur_token: dict[int, int] = {}
        cur_hidden: dict[int, torch.Tensor] = {}
        for step in range(max(ks[i] for i in live)):
            active = [j for j, i in enumerate(live) if ks[i] > step]
            counts = [new[j] if step == 0 else 1 for j in active]
            if step:
                ids = torch.tensor([cur_token[j] for j in active], dtype=torch.long)
                hidden = torch.stack([cur_hidden[j] for j in active])
            last_rows, total = [], 0
            for c in counts:
                total += c
                last_rows.append(total - 1)
            batch_views = [views[j] for j in active]
            inputs = self.runner.prepare(batch_views, counts, last_rows)  # type: ignore[arg-type]
            self.runner.backend.plan(inputs.ctx, self.runner.sliding_window)
            set_context(inputs.ctx)
            try:
                embeds = self.embed(ids.to(self.runner.device))
                logits, out_hidden = self.head(inputs.ctx.positions, embeds, hidden)
            finally:
                set_context(None)
            rows = inputs.logits_rows
            full = torch.full(
                (len(active), self.vocab), float("-inf"), device=logits.device, dtype=torch.float32
            )
            full[:, self.draft_ids] = logits[rows].float()
            owners = [seqs[live[j]] for j in active]
            q = sampler.probs(full, owners)
            drafted = sampler.draw(q, owners).tolist()
            last_hidden = out_hidden[rows]
            for r, j in enumerate(active):
                i = live[j]
                views[j].num_computed_tokens += counts[r]
                seqs[i].token_ids[starts[i] + step] = drafted[r]
                probs[i].append(q[r])
                cur_token[j] = drafted[r]
                cur_hidden[j] = last_hidden[r]
        out: list[torch.Tensor | None] = []
        for i in range(len(seqs)):
            out.append(torch.stack(probs[i]) if probs[i] else None)
        return out
