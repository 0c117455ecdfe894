"""Shared test setup: every test gets fresh in-process discovery and event buses."""

import pytest

from stator.runtime.discovery import mem as mem_discovery
from stator.runtime.event_plane import inproc as inproc_events


@pytest.fixture(autouse=True)
def _fresh_inprocess_state():
    mem_discovery._stores.clear()
    inproc_events._buses.clear()
    yield
    mem_discovery._stores.clear()
    inproc_events._buses.clear()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny model directory (trained BPE tokenizer, ChatML template, Llama config)."""
    from tests.model_factory import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("models") / "tiny")
