"""Sleep mode: give the GPU back while the engine idles, and take it again.

Level 1 copies the weights into pinned host memory and frees them, with the KV cache,
the LoRA slots and the decode graphs: waking copies the weights back (seconds, at PCIe
speed) and re-captures the graphs. Level 2 keeps nothing: waking reloads the checkpoint.
Tensors are swapped under their `Parameter`s (`p.data`), so every module that shares a
weight (a tied LM head) still shares it after waking. Buffers computed at construction
(rotary tables) are not in the checkpoint: they go to host memory at both levels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Offloaded:
    """What a sleeping model left behind: host copies (level 1) or only shapes (level 2)."""

    level: int
    params: dict[int, tuple[nn.Parameter, torch.Tensor | None, torch.Size, torch.dtype]] = field(
        default_factory=dict
    )
    buffers: list[tuple[nn.Module, str, torch.Tensor]] = field(default_factory=list)


def offload_model(model: nn.Module, level: int) -> Offloaded:
    """Free the model's device memory; level 1 keeps a host copy of every weight."""
    state = Offloaded(level)
    pin = torch.cuda.is_available()
    for module in model.modules():
        for p in module._parameters.values():
            if p is None or id(p) in state.params:
                continue
            host = None
            if level == 1:
                host = torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=pin)
                host.copy_(p.data, non_blocking=pin)
            state.params[id(p)] = (p, host, p.shape, p.dtype)
        for name, buf in module._buffers.items():
            if buf is not None and buf.device.type != "cpu":
                state.buffers.append((module, name, buf.to("cpu")))
    if pin:
        torch.cuda.synchronize()  # the host copies are complete before the weights go
    for p, _host, _shape, _dtype in state.params.values():
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)
    for module, name, host in state.buffers:
        module._buffers[name] = host
    return state


def restore_model(model: nn.Module, state: Offloaded, device: torch.device) -> bool:
    """Put the weights back on `device`. True when they came from host copies; False
    (level 2) when the tensors are allocated empty and the caller must reload them."""
    for p, host, shape, dtype in state.params.values():
        if host is not None:
            p.data = host.to(device, non_blocking=True)
        else:
            p.data = torch.empty(shape, dtype=dtype, device=device)
    for module, name, host in state.buffers:
        module._buffers[name] = host.to(device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return state.level == 1
