"""`CoreProcess`: the engine core's process and the two sockets to it, from start to exit.

The host binds two ZMQ sockets on `ipc://` paths in a private directory and starts
`python -m stator.engines.native.core_process`, which connects to them. Two pipes tie the
lives together: the core's stdin (the host holds the other end: at its EOF the core exits,
however the host went) and a pipe whose write end only the core holds (at its EOF the host
knows at once that the core is gone, without polling).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from stator.engines.base import EngineError
from stator.engines.native.core_messages import OUTPUT_DECODER, CoreFailed, CoreReady

log = logging.getLogger(__name__)

_REPO_ROOT = Path(__file__).resolve().parents[3]
_STOP_GRACE_S = 30.0  # for a core told to stop to finish its step and close its parts
_KILL_AFTER_S = 5.0  # for a core whose stdin closed to exit
_CONNECT_S = 60.0  # for the core's input connection to complete after it is ready
# After the core's pipe closes, how long a `CoreFailed` frame (the precise reason) may take
# to arrive before the death is reported with the exit code alone.
LAST_WORDS_S = 0.2


class CoreProcess:
    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._death_fd: int | None = None
        self._push: zmq.Socket | None = None
        self._pull: zmq.asyncio.Socket | None = None
        self._contexts: list[zmq.Context] = []
        self._on_exit: Callable[[], None] | None = None

    async def start(self, args: dict[str, Any], on_exit: Callable[[], None]) -> CoreReady:
        """Start the core with `args` (plus the socket addresses) and wait for its
        `CoreReady`; EngineError if it fails or dies first. Later, `on_exit()` is called
        once the process has gone (after a moment for its last frame to arrive)."""
        loop = asyncio.get_running_loop()
        self._tmp = tempfile.TemporaryDirectory(prefix="stator-core-")
        inputs, outputs = (f"ipc://{self._tmp.name}/{n}" for n in ("inputs", "outputs"))
        sync_ctx, async_ctx = zmq.Context(), zmq.asyncio.Context()
        self._contexts = [sync_ctx, async_ctx]
        self._push = sync_ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)  # a frame never blocks the host's loop
        self._push.bind(inputs)
        self._pull = async_ctx.socket(zmq.PULL)
        self._pull.bind(outputs)
        args = {**args, "inputs": inputs, "outputs": outputs}
        read, write = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        cmd = [sys.executable, "-m", "stator.engines.native.core_process", json.dumps(args)]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env, pass_fds=(write,))
        finally:
            os.close(write)
        self._death_fd = read
        exited = loop.create_future()
        loop.add_reader(read, self._exited, exited)
        first = asyncio.ensure_future(self._pull.recv())
        try:
            await asyncio.wait({first, exited}, return_when=asyncio.FIRST_COMPLETED)
            if not first.done():
                await asyncio.wait({first}, timeout=LAST_WORDS_S)
            if not first.done():
                raise EngineError(f"the engine core process exited ({self.exit_status()})")
            message = OUTPUT_DECODER.decode(first.result())
            if isinstance(message, CoreFailed):
                raise EngineError(f"the engine core failed to start: {message.reason}")
            assert isinstance(message, CoreReady), message
            await self._input_connected(exited)
        except BaseException:
            first.cancel()
            await self.close()
            raise
        self._on_exit = on_exit
        if exited.done():  # ready, then gone at once
            loop.call_later(LAST_WORDS_S, on_exit)
        log.info("engine core process started (pid %d)", self.proc.pid)
        return message

    async def _input_connected(self, exited: asyncio.Future[None]) -> None:
        """Wait until the core's input socket is connected to ours. The core connects it
        before it says ready, but a zmq connect completes in the background: until it has,
        this bound PUSH socket has no peer, a NOBLOCK send fails with EAGAIN and the frame
        (a request) is lost, its stream waiting forever (seen on a loaded CI box). A PUSH
        socket is writable exactly when it has a peer."""
        assert self._push is not None
        deadline = asyncio.get_running_loop().time() + _CONNECT_S
        while not self._push.poll(0, zmq.POLLOUT):
            if exited.done():
                raise EngineError(f"the engine core process exited ({self.exit_status()})")
            if asyncio.get_running_loop().time() > deadline:
                raise EngineError(
                    f"the engine core did not connect its input in {_CONNECT_S:.0f} s"
                )
            await asyncio.sleep(0.005)

    def _exited(self, exited: asyncio.Future[None]) -> None:
        loop = asyncio.get_running_loop()
        assert self._death_fd is not None
        loop.remove_reader(self._death_fd)
        if not exited.done():
            exited.set_result(None)
        if self._on_exit is not None:
            loop.call_later(LAST_WORDS_S, self._on_exit)

    def exit_status(self) -> str:
        code = None
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.proc.wait(timeout=LAST_WORDS_S)
        return "still running" if code is None else f"code {code}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, frame: bytes) -> None:
        if self._push is not None:
            self._push.send(frame, zmq.NOBLOCK, copy=False)

    async def recv(self) -> memoryview:
        assert self._pull is not None
        frame = await self._pull.recv(copy=False)
        return frame.buffer

    async def close(self, wait_for_exit: bool = False) -> None:
        """Stop the core: after a `Shutdown` (`wait_for_exit`), let it close its ranks and
        tiers and exit by itself; then close its stdin (it exits at once, even mid-step);
        then kill it."""
        self._on_exit = None
        proc = self.proc
        if proc is not None:
            loop = asyncio.get_running_loop()
            if wait_for_exit:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(loop.run_in_executor(None, proc.wait), _STOP_GRACE_S)
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                await asyncio.wait_for(loop.run_in_executor(None, proc.wait), _KILL_AFTER_S)
            except TimeoutError:
                log.warning("engine core pid %d did not stop; killing it", proc.pid)
                proc.kill()
                await loop.run_in_executor(None, proc.wait)
        if self._death_fd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._death_fd)
            os.close(self._death_fd)
            self._death_fd = None
        for sock in (self._push, self._pull):
            if sock is not None:
                sock.close(linger=0)
        self._push = self._pull = None
        for ctx in self._contexts:
            ctx.term()
        self._contexts = []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
