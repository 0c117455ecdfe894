"""`TransferConfig`: how a worker moves KV to or from its peers (set by the worker host)."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("auto", "local", "ipc", "nixl", "tcp")
# How blocks are copied between two pools one process addresses (`copy.METHODS`).
COPIES = ("auto", "push", "pull", "runs")


@dataclass
class TransferConfig:
    # auto: same process -> local, same host and both pools on CUDA -> ipc, other hosts
    # with the nixl package on both -> nixl, else tcp.
    kind: str = "auto"
    # local / ipc transports: `copy.copy_blocks`' method.
    copy: str = "auto"
    # Address the prefill side's transfer server binds and publishes.
    host: str = "127.0.0.1"
    # Prefill side: seconds a prompt's KV stays pinned waiting for the decode side. Decode
    # side: seconds a pull waits on the prefill server's socket (the pin would be gone).
    timeout: float = 30.0
    # Decode side: pulls (copies, pin checks, releases) pending on one prefill worker go
    # together, one launch / round trip for all (coalesced.py); off: one each.
    coalesce: bool = True

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kv transfer must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.copy not in COPIES:
            raise ValueError(
                f"kv transfer copy must be one of {', '.join(COPIES)}, got {self.copy!r}"
            )
        if self.timeout <= 0:
            raise ValueError(f"kv transfer timeout must be positive, got {self.timeout}")
