"""What a pull returns, and how it fails."""

from __future__ import annotations

from dataclasses import dataclass, field


class TransferError(Exception):
    """The blocks could not be pulled (the caller computes the prompt itself)."""


@dataclass
class PullResult:
    kind: str
    bytes: int
    blocks: int
    seconds: float  # the whole pull: checks, round trips, copies
    copy_seconds: float = 0.0  # the bytes moving (device copies, socket reads)
    # Where an IPC pull's time goes (seconds): `hop` to the copy thread, `launch` (host
    # time enqueuing the copy), `device` (GPU time from the first enqueued work to the
    # copy's end), `hop_back` to the event loop, `check_wait` for the pin check after it.
    phases: dict[str, float] = field(default_factory=dict)
    batched: int = 1  # pulls whose copies went in one launch with this one's
