"""`LoraSlots`: `max_loras` adapter slots on the device, filled on demand (LRU).

Adapters are loaded into host memory (`LoraAdapter`); a step's adapters are copied into
device slots before it runs. A slot holding an adapter of the running batch is never
evicted (the scheduler admits at most `max_loras` distinct adapters at once), so a step
always finds room. The copies go on the step's own stream, after the work already queued
there, so they never overwrite a slot a launched step still reads.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch
from torch import nn

from stator.engines.native.layers import Linear
from stator.engines.native.lora.adapter import LoraAdapter
from stator.engines.native.lora.layer import LoraLayer

log = logging.getLogger(__name__)


def lora_modules(model: nn.Module) -> dict[tuple[int, str], Linear]:
    """(layer index, module name within the layer) -> every projection LoRA may adapt."""
    out: dict[tuple[int, str], Linear] = {}
    for i, layer in enumerate(model.model.layers):
        for name, module in layer.named_modules():
            if isinstance(module, Linear):
                out[(i, name)] = module
    return out


class LoraSlots:
    def __init__(
        self,
        model: nn.Module,
        num_slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.dtype, self.device = dtype, device
        self.layers: dict[tuple[int, str], LoraLayer] = {}
        self._modules = lora_modules(model)
        self.allocate()
        self.owner: list[LoraAdapter | None] = [None] * num_slots
        self._lru: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_slots))

    def allocate(self) -> None:
        """Zeroed slot tensors on the device (again after a sleep freed them)."""
        r, s = self.max_rank, self.num_slots
        for index, (key, module) in enumerate(self._modules.items()):
            slices = list(module.shard_slices().values())
            bounds = [(sl.start, sl.stop) for sl in slices] or [(0, module.out_features)]
            a = torch.zeros(
                s, len(bounds) * r, module.in_features, dtype=self.dtype, device=self.device
            )
            b = torch.zeros(s, module.out_features, r, dtype=self.dtype, device=self.device)
            layer = LoraLayer(a, b, bounds, r, index)
            self.layers[key] = layer
            module.lora = layer
        self.owner = [None] * s

    def workspace_shape(self) -> tuple[int, int]:
        """(projections, widest shrink output): `LoraBatch.workspace` is [p, tokens, w]."""
        widest = 0
        for module in self._modules.values():
            shards = max(1, len(module.shard_slices()))
            widest = max(widest, shards * self.max_rank)
        return len(self._modules), widest

    def release(self) -> None:
        """Free the device tensors (sleep); `allocate` brings them back empty."""
        for module in self._modules.values():
            module.lora = None
        self.layers = {}
        self.owner = [None] * self.num_slots

    def nbytes(self) -> int:
        return sum(
            layer.a.numel() * layer.a.element_size() + layer.b.numel() * layer.b.element_size()
            for layer in self.layers.values()
        )

    def slots_for(self, adapters: list[LoraAdapter | None]) -> list[int]:
        """The slot of each entry (-1 for None), loading adapters that are not resident."""
        wanted = {id(a): a for a in adapters if a is not None}
        resident = {id(o): i for i, o in enumerate(self.owner) if o is not None}
        pinned = {resident[k] for k in wanted if k in resident}
        for key, adapter in wanted.items():
            if key in resident:
                continue
            slot = next((i for i in self._lru if i not in pinned), None)
            if slot is None:
                raise RuntimeError(
                    f"a step uses more than {self.num_slots} LoRA adapters (--max-loras)"
                )
            self._write(slot, adapter)
            resident[key] = slot
            pinned.add(slot)
        for slot in pinned:
            self._lru.move_to_end(slot)
        return [-1 if a is None else resident[id(a)] for a in adapters]

    def forget(self, adapter: LoraAdapter) -> None:
        """An unloaded adapter's slot becomes the first to reuse."""
        for i, owner in enumerate(self.owner):
            if owner is adapter:
                self.owner[i] = None
                self._lru.move_to_end(i, last=False)

    def _write(self, slot: int, adapter: LoraAdapter) -> None:
        r = self.max_rank
        for key, layer in self.layers.items():
            layer.a[slot].zero_()
            layer.b[slot].zero_()
            delta = adapter.modules.get(key)
            if delta is None:
                continue
            for index, (a, b) in delta.shards.items():
                rank = a.shape[0]
                start, stop = layer.bounds[index]
                layer.a[slot, index * r : index * r + rank].copy_(a, non_blocking=True)
                layer.b[slot, start:stop, :rank].copy_(b, non_blocking=True)
        self.owner[slot] = adapter
        log.debug("LoRA adapter %s -> slot %d", adapter.name, slot)
