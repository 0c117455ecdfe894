"""`--connector`: vLLM's KV connectors by short name, chained as Dynamo's `--connector` does.

One name gives that connector's `KVTransferConfig`; several give vLLM's `MultiConnector`
over them in the order given (it loads from the first that has a prompt's blocks and saves
to all). A `--kv-transfer-config` of the user's own wins over `--connector`.

- `offload`: vLLM's native CPU offloading (`OffloadingConnector`), `--offload-connector-gb`
  of pinned host memory; its KV events carry `medium="CPU"`, which stator relays as the
  host tier (`stator.engines.vllm.kv_events.tier_of`).
- `lmcache`: LMCache (`LMCacheConnectorV1`; needs the lmcache package).
- `nixl`: NIXL KV transfer between workers (`NixlConnector`; disaggregated serving).
- `kvbm`: Dynamo's KV block manager (`DynamoConnector` from the kvbm package).
- `none`: no connector (the default).
"""

from __future__ import annotations

from typing import Any

GiB = 1 << 30

_BASE: dict[str, dict[str, Any]] = {
    "offload": {"kv_connector": "OffloadingConnector"},
    "lmcache": {"kv_connector": "LMCacheConnectorV1"},
    "nixl": {"kv_connector": "NixlConnector"},
    "kvbm": {
        "kv_connector": "DynamoConnector",
        "kv_connector_module_path": "kvbm.vllm_integration.connector",
    },
}
CONNECTORS = [*_BASE, "none"]


def transfer_config(names: list[str], offload_gb: float = 8.0) -> dict[str, Any] | None:
    """The `KVTransferConfig` fields for these connectors (None: no connector)."""
    unknown = [n for n in names if n not in CONNECTORS]
    if unknown:
        raise ValueError(f"unknown --connector {unknown}; choose from {CONNECTORS}")
    chosen = [n for n in dict.fromkeys(names) if n != "none"]
    if not chosen:
        return None
    configs = []
    for name in chosen:
        cfg: dict[str, Any] = {**_BASE[name], "kv_role": "kv_both"}
        if name == "offload":
            if offload_gb <= 0:
                raise ValueError("--connector offload needs --offload-connector-gb > 0")
            cfg["kv_connector_extra_config"] = {"cpu_bytes_to_use": int(offload_gb * GiB)}
        configs.append(cfg)
    if len(configs) == 1:
        return configs[0]
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": configs},
    }
