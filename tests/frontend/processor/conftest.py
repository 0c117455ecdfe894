"""The vLLM tests' environment (CPU KV space, offline, caches) and their `fleet` fixture,
for the processor tests that run vLLM (.ci/vllm.sh runs this folder in its venv); and the
parity tests' processors, built once per model for the session (vLLM's processor copies
its tokenizer for a thread pool: on o200k_harmony that takes seconds)."""

from __future__ import annotations

import asyncio

import pytest

from tests.engines.vllm.conftest import fleet, module_fleet  # noqa: F401


@pytest.fixture(scope="session")
def tools_parity(tmp_path_factory):
    """(card, stator's processor, vLLM's) for the tool-aware template."""
    from tests.frontend.processor.models import both_processors, tools_card

    card = tools_card(tmp_path_factory.mktemp("parity") / "tools")
    return (card, *asyncio.run(both_processors(card)))


@pytest.fixture(scope="session")
def harmony_parity(tmp_path_factory):
    """(card, stator's processor, vLLM's) for GPT-OSS on o200k_harmony."""
    from tests.frontend.processor.models import both_processors, harmony_card

    card = harmony_card(tmp_path_factory.mktemp("parity") / "gpt-oss")
    return (card, *asyncio.run(both_processors(card)))
