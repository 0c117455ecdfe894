"""MXFP4, the format GPT-OSS's experts ship in (OCP microscaling): each byte holds two 4-bit
e2m1 values (low nibble first) from {±0, ±.5, ±1, ±1.5, ±2, ±3, ±4, ±6}, and every 32
values share one power-of-two scale stored as a biased exponent byte (2^(byte - 127)).

A weight [rows, cols] is stored as `blocks` [rows, cols / 32, 16] uint8 and `scales`
[rows, cols / 32] uint8; rows are output features, so a row is one contiguous run of its
input features (what a GEMM kernel reads). The dequantization is the same arithmetic as
transformers' `convert_moe_packed_tensors` (table lookup, then ldexp), so both give the
same bits.
"""

from __future__ import annotations

import torch

FP4_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
SCALE_BIAS = 127
GROUP = 32  # values per scale


def dequantize(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """blocks [..., G, 16] uint8, scales [..., G] uint8 -> [..., G * 32] of `dtype`."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != GROUP // 2:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}"
        )
    lut = torch.tensor(FP4_VALUES, dtype=dtype, device=blocks.device)
    blocks = blocks.to(torch.uint8)
    out = torch.empty(*blocks.shape[:-1], GROUP, dtype=dtype, device=blocks.device)
    out[..., 0::2] = lut[(blocks & 0x0F).long()]
    out[..., 1::2] = lut[(blocks >> 4).long()]
    exponents = scales.to(torch.int32) - SCALE_BIAS
    torch.ldexp(out, exponents.unsqueeze(-1), out=out)
    return out.flatten(-2)


def random_packed(
    shape: tuple[int, ...], generator: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (blocks, scales) of a weight `shape` [..., cols] whose values have about a
    trained model's scale (|w| <= 6 * 2^-7, RMS ~0.02)."""
    *lead, cols = shape
    groups = cols // GROUP
    # uint8 straight away: an int64 draw of 120B's largest tensor would need 8.5 GB.
    blocks = torch.randint(
        0, 256, (*lead, groups, GROUP // 2), generator=generator, device=device, dtype=torch.uint8
    )
    scales = torch.full((*lead, groups), SCALE_BIAS - 7, dtype=torch.uint8, device=device)
    return blocks, scales
