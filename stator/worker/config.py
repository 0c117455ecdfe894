"""`WorkerConfig`: what `stator worker` (and each worker of `stator run`) is told."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stator.config import option
from stator.kv.transfer.config import COPIES, KINDS
from stator.runtime.names import PREFILL_COMPONENT, EndpointName

DEFAULT_COMPONENT = "backend"
DEFAULT_ENDPOINT = "generate"
ROLES = ["aggregated", "prefill", "decode"]


@dataclass
class WorkerConfig:
    model: str = option(
        "",
        "Model to serve: a local directory or a Hugging Face repo id "
        "(empty = the tiny model bundled with stator)",
        metavar="PATH_OR_REPO",
    )
    served_model_name: str | None = option(
        None,
        "Name clients use in requests; unset: the model directory's name, or the repo id",
    )
    endpoint: str | None = option(
        None,
        "Endpoint to serve: namespace.component.endpoint, or component.endpoint inside "
        "--namespace; unset: NAMESPACE.backend.generate",
    )
    role: str = option(
        "aggregated",
        "Serve whole requests, or only the prefill / decode half of disaggregated serving "
        "(prefill workers register under NAMESPACE.prefill.generate)",
        choices=ROLES,
    )
    kv_transfer: str = option(
        "auto",
        "How KV moves between prefill and decode workers: auto (CUDA IPC between GPU "
        "processes of one host; NIXL between hosts when the nixl package is installed; "
        "else TCP), local (one process), ipc, nixl, tcp",
        choices=list(KINDS),
    )
    kv_transfer_copy: str = option(
        "auto",
        "Decode role, GPU pools: how blocks cross between GPUs (docs/disagg.md): push (one "
        "kernel on the prefill GPU), pull (one kernel on this GPU, reading the prefill pool "
        "mapped here), runs (torch copies), auto (pull)",
        choices=list(COPIES),
    )
    kv_transfer_host: str = option(
        "",
        "Address the KV transfer server of a prefill worker binds and publishes "
        "(empty: the runtime's --host)",
    )
    kv_transfer_timeout: float = option(
        30.0,
        "Prefill role: seconds a prompt's KV stays pinned for the decode side before it is "
        "released unasked; decode role: seconds a pull waits on a quiet prefill worker",
    )
    kv_transfer_coalesce: bool = option(
        True,
        "Decode role: pulls pending on one prefill worker share one copy launch (over the "
        "union of their blocks), one pin-check and one release round trip",
    )
    reasoning_parser: str | None = option(None, "Reasoning parser the frontend should apply")
    tool_call_parser: str | None = option(None, "Tool-call parser the frontend should apply")
    max_model_len: int = option(
        0,
        "Context length in tokens, for the engine and the model card alike (0 = the "
        "engine's own); more than the engine can hold is refused at start-up",
        aliases=("--context-length",),
    )
    migration_limit: int = option(
        0, "How many times a stream cut by a dying worker may be re-sent elsewhere"
    )
    health_check_interval: float = option(
        30.0, "Seconds between engine health checks (a one-token generate); 0 = off"
    )
    health_check_timeout: float = option(
        20.0, "Seconds a health check may take before the engine is declared dead"
    )
    load_report_interval: float = option(
        1.0, "Seconds between load reports on the event plane; 0 = off"
    )
    system_port: int | None = option(
        None, "Port of the worker's status server (/health, /live, /metrics); unset = off"
    )
    inline_files_limit: int = option(
        1 << 20,
        "Tokenizer/template files up to this many bytes in total travel inside the model "
        "card, for frontends on other hosts (etcd's default value limit is 1.5 MiB)",
    )

    def endpoint_name(self, namespace: str) -> EndpointName:
        """The endpoint to serve. A bare `component.endpoint` joins `namespace`, so that
        `--namespace` alone moves the worker to another namespace."""
        if not self.endpoint:
            component = PREFILL_COMPONENT if self.role == "prefill" else DEFAULT_COMPONENT
            return EndpointName(namespace, component, DEFAULT_ENDPOINT)
        if self.endpoint.count(".") == 1:
            return EndpointName.parse(f"{namespace}.{self.endpoint}")
        return EndpointName.parse(self.endpoint)

    def served_name(self, model_path: Path) -> str:
        if self.served_model_name:
            return self.served_model_name
        # A repo id (org/name) is what users type in requests; a local dir, its name.
        if self.model and not Path(self.model).exists() and "/" in self.model.strip("/"):
            return self.model
        return model_path.name
