"""vLLM's engine arguments for a stator worker: the user's `--engine-args`, plus what
stator needs of vLLM (prefix caching, stats for metrics, the KV event publisher, a free
LoRA slot, and the chain of KV connectors a role and `--connector` ask for)."""

from __future__ import annotations

import logging
from typing import Any

from vllm.config.kv_events import KVEventsConfig
from vllm.config.kv_transfer import KVTransferConfig
from vllm.engine.arg_utils import AsyncEngineArgs

from stator.engines.vllm.config import VllmConfig
from stator.engines.vllm.connectors import DEFAULT_OFFLOAD_GIB, transfer_config

log = logging.getLogger(__name__)

KV_TOPIC = "kv"


def engine_args(
    config: VllmConfig,
    model_path: str,
    served_name: str,
    kv_endpoint: str | None = None,
    role_connector: dict[str, Any] | None = None,
) -> AsyncEngineArgs:
    """vLLM's engine arguments: the user's, plus what stator needs (prefix caching, stats
    for metrics, the KV event publisher sending to `kv_endpoint`, a free LoRA slot, the KV
    connectors: `role_connector`, a prefill or decode role's, leads `--connector`'s)."""
    kwargs: dict[str, Any] = {
        "enable_prefix_caching": True,
        **config.engine_args,
        "model": model_path,
        "served_model_name": [served_name],
        "disable_log_stats": False,
    }
    if config.kv_events and kv_endpoint and kwargs.get("kv_events_config") is None:
        kwargs["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=kv_endpoint, topic=KV_TOPIC
        )
    names = list(config.connector)
    offload_gib = kwargs.get("kv_offloading_size")
    if (
        offload_gib is not None
        and (names or role_connector)
        and not kwargs.get("kv_transfer_config")
    ):
        # vLLM turns --kv-offloading-size into a kv_transfer_config of its own that would
        # replace this chain (and a role's connector with it): chain its connector here.
        if kwargs.pop("kv_offloading_backend", "native") != "native":
            raise ValueError(
                "--kv-offloading-backend lmcache cannot chain with --connector or a prefill / "
                "decode role: name lmcache in --connector instead"
            )
        del kwargs["kv_offloading_size"]
        names.append("offload")
    connectors = transfer_config(
        names, DEFAULT_OFFLOAD_GIB if offload_gib is None else offload_gib, role_connector
    )
    if connectors is not None:
        if kwargs.get("kv_transfer_config") is not None:
            log.warning(
                "--kv-transfer-config given: it must name every connector (ignored: %s)",
                connectors["kv_connector"],
            )
        else:
            kwargs["kv_transfer_config"] = KVTransferConfig(**connectors)
    if kwargs.get("enable_lora") and "max_loras" not in config.engine_args:
        kwargs["max_loras"] = config.default_max_loras
    return AsyncEngineArgs(**kwargs)
