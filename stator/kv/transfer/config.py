"""`TransferConfig`: how a worker moves KV to or from its peers (set by the worker host)."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("auto", "local", "ipc", "tcp", "nixl")


@dataclass
class TransferConfig:
    # auto: same process -> local, same host and both pools on CUDA -> ipc, else tcp.
    kind: str = "auto"
    # Address the prefill side's transfer server binds and publishes.
    host: str = "127.0.0.1"
    # Prefill side: seconds a prompt's KV stays pinned waiting for the decode side.
    timeout: float = 30.0

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kv transfer must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.timeout <= 0:
            raise ValueError(f"kv transfer timeout must be positive, got {self.timeout}")
