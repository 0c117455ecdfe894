"""decode_prompt_embeds: base64 `torch.save` tensors in, checked raw bytes out."""

from __future__ import annotations

import base64
import io
import os
import pickle

import pytest

torch = pytest.importorskip("torch", reason="prompt embeddings need torch")

from stator.llm.prompt_embeds import (  # noqa: E402
    InvalidPromptEmbeds,
    decode_prompt_embeds,
    embeds_tensor,
)

HIDDEN = 8


def saved(obj) -> str:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return base64.b64encode(buf.getvalue()).decode()


def test_round_trip_keeps_values_shape_and_dtype():
    tensor = torch.randn(5, HIDDEN, dtype=torch.float32)
    decoded = decode_prompt_embeds(saved(tensor), HIDDEN, max_tokens=16)
    assert decoded.shape == [5, HIDDEN] and decoded.dtype == "float32"
    back = embeds_tensor(decoded.data, decoded.shape, decoded.dtype, HIDDEN, 16)
    assert torch.equal(back, tensor)


def test_bfloat16_and_batch_of_one_are_accepted():
    tensor = torch.randn(1, 3, HIDDEN).to(torch.bfloat16)
    decoded = decode_prompt_embeds(saved(tensor), HIDDEN, max_tokens=16)
    assert decoded.shape == [3, HIDDEN] and decoded.dtype == "bfloat16"
    back = embeds_tensor(decoded.data, decoded.shape, decoded.dtype, HIDDEN, 16)
    assert torch.equal(back, tensor[0])


def test_bad_base64_is_refused():
    with pytest.raises(InvalidPromptEmbeds, match="base64"):
        decode_prompt_embeds("not base64 at all!!", HIDDEN, 16)
    with pytest.raises(InvalidPromptEmbeds, match="non-empty"):
        decode_prompt_embeds("", HIDDEN, 16)


class Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_pickle_payloads_are_refused():
    # A raw pickle that would run a command, and a torch.save of an arbitrary object.
    raw = base64.b64encode(pickle.dumps(Exploit())).decode()
    with pytest.raises(InvalidPromptEmbeds, match="not a saved tensor"):
        decode_prompt_embeds(raw, HIDDEN, 16)
    with pytest.raises(InvalidPromptEmbeds, match="not a saved tensor"):
        decode_prompt_embeds(saved(Exploit()), HIDDEN, 16)


def test_non_tensor_and_wrong_shapes_are_refused():
    with pytest.raises(InvalidPromptEmbeds, match="not a tensor"):
        decode_prompt_embeds(saved({"a": torch.zeros(2, HIDDEN)}), HIDDEN, 16)
    with pytest.raises(InvalidPromptEmbeds, match="hidden size"):
        decode_prompt_embeds(saved(torch.zeros(4, HIDDEN + 1)), HIDDEN, 16)
    with pytest.raises(InvalidPromptEmbeds, match="2-D"):
        decode_prompt_embeds(saved(torch.zeros(HIDDEN)), HIDDEN, 16)
    with pytest.raises(InvalidPromptEmbeds, match="rows"):
        decode_prompt_embeds(saved(torch.zeros(17, HIDDEN)), HIDDEN, 16)
    with pytest.raises(InvalidPromptEmbeds, match="dtype"):
        decode_prompt_embeds(saved(torch.zeros(2, HIDDEN, dtype=torch.int64)), HIDDEN, 16)
    with pytest.raises(InvalidPromptEmbeds, match="larger"):
        decode_prompt_embeds("A" * 100, HIDDEN, 16, max_b64_chars=10)


def test_wire_form_is_checked():
    with pytest.raises(InvalidPromptEmbeds, match="bytes"):
        embeds_tensor(b"\0" * 10, [2, HIDDEN], "float32", HIDDEN, 16)
    with pytest.raises(InvalidPromptEmbeds, match="shape"):
        embeds_tensor(b"\0" * 64, None, "float32", HIDDEN, 16)
    nan = torch.full((1, HIDDEN), float("nan")).numpy().tobytes()
    with pytest.raises(InvalidPromptEmbeds, match="NaN"):
        embeds_tensor(nan, [1, HIDDEN], "float32", HIDDEN, 16)


def test_non_finite_values_are_refused_at_decode():
    tensor = torch.zeros(2, HIDDEN)
    tensor[1, 3] = float("inf")
    with pytest.raises(InvalidPromptEmbeds, match="NaN or infinite"):
        decode_prompt_embeds(saved(tensor), HIDDEN, 16)
