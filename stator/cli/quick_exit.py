"""Ending a serving process without the interpreter's teardown of its modules.

When `stator frontend`, `worker`, `run` or `global-router` returns, it has drained, closed
its engines, servers and clients and given up its discovery lease. What the interpreter
still does after that is join the threads left, run the `atexit` callbacks (vLLM's,
multiprocessing's, logging's) and then free every module's objects. That last part only
returns memory to a process about to end, yet with vLLM imported it takes 2 s on an idle
core (torch alone: 0.6 s), and a `--processor vllm` frontend under load took ~14 s to exit
after its drain had finished: time a deployment's rolling restart and every test that
stops a process waits for.

`QuickExit.install()` registers a callback first thing, so that it runs after every other
`atexit` callback; once `arm(code)` says the command ended normally, that callback flushes
logging and the standard streams and ends the process with `code` (`os._exit`). A
command that raised is left to the interpreter's ordinary exit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys

# The subcommands that serve until stopped and close what they opened before returning.
SERVING_COMMANDS = frozenset({"run", "frontend", "worker", "global-router"})


class QuickExit:
    def __init__(self) -> None:
        self.code: int | None = None

    @classmethod
    def install(cls) -> QuickExit:
        """Register the exit callback. Call it before anything else registers one: the
        callbacks run last-registered first, and those registered before this one would
        be skipped."""
        quick = cls()
        atexit.register(quick._end)
        return quick

    def arm(self, code: int) -> None:
        self.code = code

    def _end(self) -> None:
        if self.code is None:
            return
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(self.code)
