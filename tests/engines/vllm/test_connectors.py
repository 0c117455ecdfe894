"""`--connector`: vLLM KV connectors by name, chained with MultiConnector."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.engines.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)  # the package imports vllm

from stator.engines.vllm.connectors import transfer_config
from stator.engines.vllm.kv_events import convert_event, tier_of

GiB = 1 << 30


def test_one_connector_is_its_own_config():
    assert transfer_config(["lmcache"]) == {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": "kv_both",
    }
    assert transfer_config(["offload"], offload_gib=2) == {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 2 * GiB},
    }


def test_several_connectors_chain_in_order():
    cfg = transfer_config(["nixl", "offload", "nixl"], offload_gib=1)
    assert cfg["kv_connector"] == "MultiConnector"
    names = [c["kv_connector"] for c in cfg["kv_connector_extra_config"]["connectors"]]
    assert names == ["NixlConnector", "OffloadingConnector"]


def test_none_and_unknown():
    assert transfer_config([]) is None
    assert transfer_config(["none"]) is None
    with pytest.raises(ValueError, match="unknown --connector"):
        transfer_config(["mooncake-ish"])
    with pytest.raises(ValueError, match="kv-offloading-size"):
        transfer_config(["offload"], offload_gib=0)


def test_a_roles_connector_leads_the_chain_once():
    role = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert transfer_config([], first=role) == role
    cfg = transfer_config(["offload", "nixl"], offload_gib=1, first=role)
    names = [c["kv_connector"] for c in cfg["kv_connector_extra_config"]["connectors"]]
    assert cfg["kv_connector"] == "MultiConnector"
    assert names == ["NixlConnector", "OffloadingConnector"]


def test_vllm_medium_becomes_the_tier():
    assert tier_of(SimpleNamespace(medium="CPU")) == "host"
    assert tier_of(SimpleNamespace(medium="lmcache")) == "lmcache"  # unknown: ignored later
    assert tier_of(SimpleNamespace(medium=None)) == "gpu"
    assert tier_of(SimpleNamespace(medium="GPU")) == "gpu"
    assert tier_of(SimpleNamespace()) == "gpu"


def test_converted_events_carry_the_tier():
    class BlockStored:
        block_hashes = [5]
        parent_block_hash = None
        token_ids = [1, 2]
        block_size = 2
        lora_name = None
        medium = "CPU"

    class BlockRemoved:
        block_hashes = [5]
        medium = "CPU"

    assert convert_event(BlockStored()).tier == "host"
    assert convert_event(BlockRemoved()).tier == "host"
