"""Stop signals for a serving process: the first SIGTERM/SIGINT asks for a graceful stop
(drain), a second one asks to stop waiting. Generic on purpose; `stator.runtime.lifecycle`
does the same for every serving process once it exists."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.hurry = asyncio.Event()

    def __call__(self, signame: str = "stop") -> None:
        if self.stop.is_set():
            log.warning("%s again: not waiting for in-flight requests", signame)
            self.hurry.set()
        else:
            log.info("%s: unregistering and draining in-flight requests", signame)
            self.stop.set()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Within the block, SIGTERM and SIGINT set the returned request's events."""
    loop = asyncio.get_running_loop()
    request = StopRequest()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, request, sig.name)
    try:
        yield request
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
