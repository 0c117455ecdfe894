"""`--connector` reaches vLLM: engine arguments, and (CPU build) an engine that offloads."""

from __future__ import annotations

import pytest

from tests.engines.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from stator.engines.vllm import VllmConfig
from stator.engines.vllm.args import engine_args
from stator.engines.vllm.disagg import kv_transfer_config


def test_connector_builds_the_kv_transfer_config(llama_dir):
    config = VllmConfig.make({"kv_offloading_size": 1.0}, connector=["offload", "lmcache"])
    args = engine_args(config, str(llama_dir), "m")
    ktc = args.kv_transfer_config
    assert ktc.kv_connector == "MultiConnector" and ktc.kv_role == "kv_both"
    chain = ktc.kv_connector_extra_config["connectors"]
    assert [c["kv_connector"] for c in chain] == ["OffloadingConnector", "LMCacheConnectorV1"]
    assert chain[0]["kv_connector_extra_config"] == {"cpu_bytes_to_use": 1 << 30}
    # vLLM would replace the chain with its own offloading connector: the flag is consumed
    assert args.kv_offloading_size is None


def test_kv_offloading_size_alone_is_vllms_own(llama_dir):
    args = engine_args(VllmConfig.make({"kv_offloading_size": 2.0}), str(llama_dir), "m")
    assert args.kv_transfer_config is None and args.kv_offloading_size == 2.0


def test_a_roles_connector_chains_with_offloading(llama_dir):
    role = kv_transfer_config("prefill", False, storage="/x")
    for config in (
        VllmConfig.make({}, connector=["offload"]),
        VllmConfig.make({"kv_offloading_size": 0.5}),  # vLLM's flag alone
    ):
        args = engine_args(config, str(llama_dir), "m", role_connector=role)
        chain = args.kv_transfer_config.kv_connector_extra_config["connectors"]
        assert [c["kv_connector"] for c in chain] == ["ExampleConnector", "OffloadingConnector"]
        assert args.kv_offloading_size is None
    config = VllmConfig.make({"kv_offloading_size": 1.0, "kv_offloading_backend": "lmcache"})
    with pytest.raises(ValueError, match="name lmcache in --connector"):
        engine_args(config, str(llama_dir), "m", role_connector=role)


async def test_the_started_engine_chains_its_roles_connector(llama_dir, monkeypatch):
    """`start` builds the arguments with the role's connector leading --connector's (it
    used to skip the role's when --connector offload was given)."""
    from stator.engines.vllm import create_engine, engine

    seen = []

    def refuse(args, *a, **k):
        seen.append(args)
        raise RuntimeError("not starting vLLM in this test")

    monkeypatch.setattr(engine.AsyncLLM, "from_engine_args", refuse)
    eng = create_engine(
        VllmConfig.make({}, connector=["offload"], kv_events=False), str(llama_dir), "m"
    )
    eng.role = "decode"
    with pytest.raises(RuntimeError, match="not starting"):
        await eng.start()
    chain = seen[0].kv_transfer_config.kv_connector_extra_config["connectors"]
    assert [c["kv_connector"] for c in chain] == ["ExampleConnector", "OffloadingConnector"]


def test_users_own_kv_transfer_config_wins(llama_dir):
    from vllm.config.kv_transfer import KVTransferConfig

    own = KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both")
    config = VllmConfig.make({"kv_transfer_config": own}, connector=["offload"])
    assert engine_args(config, str(llama_dir), "m").kv_transfer_config is own


def test_no_connector_leaves_vllm_alone(llama_dir):
    assert engine_args(VllmConfig.make({}), str(llama_dir), "m").kv_transfer_config is None


@pytest.mark.integration
async def test_offload_connector_serves(llama_dir):
    """The offloading connector chained by --connector serves a request. vLLM 0.32 offloads
    only from CUDA-alike and XPU devices (its CPU build refuses at start-up, "CPU
    Offloading is currently only supported on CUDA-alike and XPU GPUs"): the test skips on
    the same condition vLLM checks, without starting an engine to find out."""
    from vllm.platforms import current_platform

    from stator.engines.vllm import create_engine
    from tests.engines.vllm.helpers import TEST_ENGINE_ARGS, collect, greedy_request

    if not (current_platform.is_cuda_alike() or current_platform.is_xpu()):
        pytest.skip(
            f"vLLM offloads only from CUDA-alike and XPU devices, not {current_platform.device_name}"
        )
    config = VllmConfig.make(
        {**TEST_ENGINE_ARGS, "kv_offloading_size": 0.05}, connector=["offload"]
    )
    eng = create_engine(config, str(llama_dir), "tiny")
    await eng.start()
    try:
        outs = await collect(eng.generate(greedy_request("r", list(range(10, 90)), 4)))
        assert outs[-1].finish_reason is not None
    finally:
        await eng.shutdown()
