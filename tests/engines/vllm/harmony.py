"""GPT-OSS Harmony helpers for the vLLM tests: the real o200k_harmony tokenizer (rebuilt
offline, tests/parsers/harmony_vocab.py) and vLLM's own chat prompt ids for a request."""

from __future__ import annotations

import copy
import types
from pathlib import Path

import pytest

from tests.parsers.harmony_vocab import VocabUnavailable, o200k_harmony_tokenizer_json


def harmony_tokenizer_json() -> Path:
    """The o200k_harmony `tokenizer.json`, or a skip that says why it cannot be built."""
    try:
        return o200k_harmony_tokenizer_json()
    except VocabUnavailable as exc:
        pytest.skip(f"the o200k_harmony tokenizer cannot be rebuilt offline here: {exc}")


def vllm_chat_prompt_ids(body: dict) -> list[int]:
    """vLLM's server preprocessing for a GPT-OSS chat request, as its `render_chat` runs it
    (`OnlineRenderer._make_request_with_harmony` on vLLM's own `ChatCompletionRequest`)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.renderers.online_renderer import OnlineRenderer

    request = ChatCompletionRequest(**{"model": "gpt-oss", **copy.deepcopy(body)})
    # What `_make_request_with_harmony` reads of the server: no disaggregated prompt reuse,
    # no built-in browsing or code tools (as for any chat request).
    server = types.SimpleNamespace(
        renderer=None, supports_browsing=False, supports_code_interpreter=False
    )
    include_tools = request.tools is not None
    _messages, inputs = OnlineRenderer._make_request_with_harmony(server, request, include_tools)
    return list(inputs[0]["prompt_token_ids"])
