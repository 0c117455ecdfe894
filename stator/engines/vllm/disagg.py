"""Disaggregated serving on vLLM: stator's roles and `DisaggParams` mapped onto vLLM's KV
connectors and their `kv_transfer_params`. Pure functions (no engine needed).

- A prefill or decode worker starts vLLM with a KV connector (`kv_transfer_config`), unless
  the user passed one: NixlConnector on GPUs (RDMA / NVLink through NIXL),
  ExampleConnector on the CPU build (KV through files in a shared directory).
- The router's prefill request (an empty `DisaggParams`) asks vLLM to keep the KV for a
  remote decode (`do_remote_decode`); vLLM's final output carries the connector's own
  transfer parameters, which travel opaquely in `DisaggParams.transfer["vllm"]`.
- A decode request carrying them asks vLLM to pull (`do_remote_prefill`). KV from a native
  prefill worker (no "vllm" entry) cannot be pulled by vLLM: the decode worker computes
  the prompt itself.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from stator.protocols import DisaggParams, EngineRequest

GPU_CONNECTOR = "NixlConnector"
CPU_CONNECTOR = "ExampleConnector"


def kv_transfer_config(role: str, on_gpu: bool, storage: str | None = None) -> dict | None:
    """The `kv_transfer_config` a worker of `role` starts vLLM with (None: aggregated)."""
    if role == "aggregated":
        return None
    if on_gpu:
        return {"kv_connector": GPU_CONNECTOR, "kv_role": "kv_both"}
    path = storage or str(Path(tempfile.gettempdir()) / "stator-vllm-kv")
    return {
        "kv_connector": CPU_CONNECTOR,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": path},
    }


def request_kv_params(request: EngineRequest) -> dict[str, Any] | None:
    """`kv_transfer_params` for vLLM's SamplingParams.extra_args (None: none)."""
    disagg = request.disagg
    if disagg is None:
        return None
    if disagg.prefill_worker_id is None:  # the prefill half: keep the KV for a decode side
        return {"do_remote_decode": True, "do_remote_prefill": False}
    remote = disagg.transfer.get("vllm")
    if not isinstance(remote, dict):
        return None  # not a vLLM prefill worker's KV: computed here
    return {**remote, "do_remote_prefill": True, "do_remote_decode": False}


def prefill_params(
    worker_id: int, request: EngineRequest, kv_params: dict[str, Any] | None, block_size: int
) -> DisaggParams | None:
    """The `DisaggParams` of a vLLM prefill worker's final output."""
    if request.disagg is None or request.disagg.prefill_worker_id is not None:
        return None
    # ExampleConnector answers no params: its decode side finds the KV by the prompt.
    return DisaggParams(
        prefill_worker_id=worker_id,
        num_prompt_tokens=len(request.token_ids),
        transfer={"kind": "vllm", "vllm": dict(kv_params or {})},
        prefill_request_id=request.request_id,
        block_size=block_size,
    )
