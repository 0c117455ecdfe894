"""Tiny checkpoints shared by the native-engine tests (built once per session)."""

from __future__ import annotations

import pytest
import torch

from tests.engines.native.models import ARCHITECTURES, build_model

# The dev box's 2 cores are shared: torch's thread pool then spins against other processes
# and tiny ops get ~100x slower. One thread keeps these tests fast and steady.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """name -> (model dir, HF reference model in float32), built on first use."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = build_model(tmp_path_factory.mktemp(name) / "model", name)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def llama(checkpoints):
    return checkpoints("llama3")


@pytest.fixture(params=sorted(ARCHITECTURES))
def architecture(request):
    return request.param
