"""`--connector`: vLLM's KV connectors by short name, chained as Dynamo's `--connector` does.

One name gives that connector's `KVTransferConfig`; several give vLLM's `MultiConnector`
over them in the order given (it loads from the first that has a prompt's blocks and saves
to all). A `--kv-transfer-config` of the user's own wins over `--connector`.

- `offload`: vLLM's native CPU offloading (`OffloadingConnector`), `--kv-offloading-size`
  GiB of pinned host memory (vLLM's own flag; 8 when not given); its KV events carry
  `medium="CPU"`, which stator relays as the host tier (`stator.engines.vllm.kv_events.tier_of`).
- `lmcache`: LMCache (`LMCacheConnectorV1`; needs the lmcache package).
- `nixl`: NIXL KV transfer between workers (`NixlConnector`; disaggregated serving).
- `kvbm`: Dynamo's KV block manager (`DynamoConnector` from the kvbm package).
- `none`: no connector (the default).
"""

from __future__ import annotations

from typing import Any

GiB = 1 << 30
DEFAULT_OFFLOAD_GIB = 8.0

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


def transfer_config(
    names: list[str],
    offload_gib: float = DEFAULT_OFFLOAD_GIB,
    first: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The `KVTransferConfig` fields for these connectors (None: no connector). `first`, a
    connector's own fields, leads the chain: a disaggregated role's connector, which must
    see a decode request before an offloading connector could claim its prompt."""
    unknown = [n for n in names if n not in CONNECTORS]
    if unknown:
        raise ValueError(f"unknown --connector {unknown}; choose from {CONNECTORS}")
    chosen = [n for n in dict.fromkeys(names) if n != "none"]
    configs = [first] if first is not None else []
    for name in chosen:
        cfg: dict[str, Any] = {**_BASE[name], "kv_role": "kv_both"}
        if first is not None and cfg["kv_connector"] == first["kv_connector"]:
            continue  # the role's connector already leads the chain
        if name == "offload":
            if offload_gib <= 0:
                raise ValueError("--connector offload needs --kv-offloading-size > 0")
            cfg["kv_connector_extra_config"] = {"cpu_bytes_to_use": int(offload_gib * GiB)}
        configs.append(cfg)
    if not configs:
        return None
    if len(configs) == 1:
        return configs[0]
    return {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": configs},
    }
