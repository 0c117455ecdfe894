"""Prompt embeddings: a client's base64 `torch.save` tensor, checked and made wire-safe.

The OpenAI completions API of vLLM takes `prompt_embeds` as base64 of a saved tensor
[num_tokens, hidden]. A saved tensor is a pickle, so it is read only with torch's
restricted loader (`weights_only=True`: tensors and plain containers, never arbitrary
objects) and then checked: a dense float tensor, 2-D (or 3-D with a batch of one), its
width the model's hidden size, at most `max_tokens` rows. What crosses the request plane
is the raw bytes plus shape and dtype (`EngineRequest.prompt_embeds*`): no pickle ever
leaves the frontend. Needs torch (imported on use).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import warnings
from dataclasses import dataclass
from typing import Any

# dtype name on the wire -> (torch dtype attribute, bytes per element)
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}
# A base64 payload above this many characters is refused before decoding.
DEFAULT_MAX_B64_CHARS = 64 << 20


class InvalidPromptEmbeds(ValueError):
    """The prompt embeddings are malformed, unsafe, or do not fit the model."""


@dataclass(frozen=True)
class PromptEmbeds:
    data: bytes
    shape: list[int]
    dtype: str

    @property
    def num_tokens(self) -> int:
        return self.shape[0]


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise InvalidPromptEmbeds("prompt embeddings need torch installed here") from exc
    return torch


def decode_prompt_embeds(
    b64: str,
    hidden_size: int,
    max_tokens: int,
    *,
    max_b64_chars: int = DEFAULT_MAX_B64_CHARS,
) -> PromptEmbeds:
    """Decode and check a base64 `torch.save` tensor; raise InvalidPromptEmbeds."""
    if not isinstance(b64, str) or not b64:
        raise InvalidPromptEmbeds("prompt_embeds must be a non-empty base64 string")
    if len(b64) > max_b64_chars:
        raise InvalidPromptEmbeds(f"prompt_embeds is larger than {max_b64_chars} characters")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidPromptEmbeds(f"prompt_embeds is not valid base64: {exc}") from exc
    torch = _torch()
    try:
        with warnings.catch_warnings():  # torch warns about odd pickle protocols; we refuse
            warnings.simplefilter("ignore")
            tensor = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except Exception as exc:  # the restricted unpickler refuses anything but tensors
        raise InvalidPromptEmbeds(
            f"prompt_embeds is not a saved tensor (only torch.save tensors are accepted): "
            f"{type(exc).__name__}"
        ) from exc
    if not isinstance(tensor, torch.Tensor):
        raise InvalidPromptEmbeds(f"prompt_embeds holds a {type(tensor).__name__}, not a tensor")
    if tensor.layout != torch.strided:
        raise InvalidPromptEmbeds("prompt_embeds must be a dense tensor")
    if tensor.dim() == 3 and tensor.shape[0] == 1:
        tensor = tensor[0]
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        raise InvalidPromptEmbeds(f"prompt_embeds dtype {dtype} is not one of {sorted(DTYPES)}")
    check_shape(list(tensor.shape), hidden_size, max_tokens)
    if not bool(torch.isfinite(tensor).all()):
        raise InvalidPromptEmbeds("prompt_embeds contains NaN or infinite values")
    data = tensor.contiguous().view(torch.uint8).numpy().tobytes()
    return PromptEmbeds(data=data, shape=list(tensor.shape), dtype=dtype)


def check_shape(shape: list[int], hidden_size: int, max_tokens: int) -> None:
    if len(shape) != 2:
        raise InvalidPromptEmbeds(f"prompt_embeds must be 2-D [tokens, hidden], got shape {shape}")
    if shape[1] != hidden_size:
        raise InvalidPromptEmbeds(
            f"prompt_embeds width {shape[1]} does not match the model's hidden size {hidden_size}"
        )
    if not 1 <= shape[0] <= max_tokens:
        raise InvalidPromptEmbeds(f"prompt_embeds has {shape[0]} rows; allowed: 1 to {max_tokens}")


def embeds_tensor(
    data: bytes, shape: list[int] | None, dtype: str | None, hidden_size: int, max_tokens: int
) -> Any:
    """The wire form (`EngineRequest.prompt_embeds*`) back as a torch tensor, checked."""
    if shape is None or dtype is None:
        raise InvalidPromptEmbeds("prompt_embeds needs prompt_embeds_shape and prompt_embeds_dtype")
    if dtype not in DTYPES:
        raise InvalidPromptEmbeds(f"prompt_embeds dtype {dtype} is not one of {sorted(DTYPES)}")
    check_shape(list(shape), hidden_size, max_tokens)
    expected = math.prod(shape) * DTYPES[dtype]
    if len(data) != expected:
        raise InvalidPromptEmbeds(
            f"prompt_embeds has {len(data)} bytes; shape {shape} of {dtype} needs {expected}"
        )
    torch = _torch()
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    tensor = flat.view(getattr(torch, dtype)).reshape(shape)
    if not bool(torch.isfinite(tensor).all()):
        raise InvalidPromptEmbeds("prompt_embeds contains NaN or infinite values")
    return tensor


__all__ = [
    "InvalidPromptEmbeds",
    "PromptEmbeds",
    "check_shape",
    "decode_prompt_embeds",
    "embeds_tensor",
]
