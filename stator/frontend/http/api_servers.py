"""`stator frontend --api-server-count N` (vLLM's name for it): N frontend processes serve
one HTTP port, so that the frontend's Python work spreads over N cores.

Each process binds the port with SO_REUSEPORT (the kernel spreads new connections over
the listening sockets), runs its own model manager and router, and keeps its router's
bookings in step with the others' through replica sync (`--router-replica-sync`, turned on
by `stator frontend` where the router reads load). This module is the supervisor around them: it holds the port, starts the
processes, forwards SIGTERM/SIGINT, and waits.

A process that dies is logged and not restarted; the others keep serving (the kernel
stops sending connections to a closed socket, and replica sync drops the dead one's
bookings after `--router-replica-ttl`). The supervisor exits when the last one has:
0 when all exited 0, else 1. `/metrics` is per process: a scrape sees the process the
connection landed on.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stator.config import option

log = logging.getLogger(__name__)


@dataclass
class ApiServerConfig:
    api_server_count: int = option(
        1,
        "Frontend processes serving the HTTP port together (SO_REUSEPORT), each with its "
        "own router, bookings shared through --router-replica-sync (turned on for them "
        "where the router mode reads load); "
        "/metrics is per process",
    )

    def validate(self) -> None:
        if self.api_server_count < 1:
            raise ValueError(f"--api-server-count must be at least 1, got {self.api_server_count}")
        if self.api_server_count > 1 and not hasattr(socket, "SO_REUSEPORT"):
            raise ValueError("--api-server-count > 1 needs SO_REUSEPORT, which this OS lacks")


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) with SO_REUSEPORT and SO_REUSEADDR, not
    listening. The supervisor holds one to resolve port 0 to a port every server process
    then binds, and to fail early (OSError) when another program holds the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when the supervisor dies (even by SIGKILL), so
    that no server outlives it. Elsewhere there is no such call, and nothing is done."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def _child_main(target: Callable[..., int], args: tuple[Any, ...]) -> None:
    # A process group of its own: a terminal's Ctrl-C reaches the supervisor only, which
    # passes one SIGTERM on (a second signal would cut the servers' drain short).
    os.setpgrp()
    _die_with_parent()
    sys.exit(target(*args))


def run_api_servers(count: int, target: Callable[..., int], args: tuple[Any, ...]) -> int:
    """Run `target(*args)` in `count` processes (spawned: a fresh interpreter each, so
    `target` and `args` must pickle); forward SIGTERM/SIGINT to them; return when all
    have exited: 0 if every one exited 0, else 1."""
    context = multiprocessing.get_context("spawn")
    procs = [
        context.Process(target=_child_main, args=(target, args), name=f"api-server-{i}")
        for i in range(count)
    ]

    def forward(signum: int, _frame: object) -> None:
        for proc in procs:
            if proc.pid is not None and proc.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for proc in procs:
            proc.start()
        log.info("started %d API server processes: pids %s", count, [p.pid for p in procs])
        running = {proc.sentinel: proc for proc in procs}
        while running:
            for sentinel in multiprocessing.connection.wait(list(running)):
                proc = running.pop(sentinel)  # type: ignore[call-overload]
                proc.join()
                level = logging.INFO if proc.exitcode == 0 else logging.ERROR
                log.log(
                    level,
                    "API server %s (pid %d) exited with %s; %d still serving",
                    proc.name,
                    proc.pid,
                    proc.exitcode,
                    len(running),
                )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for proc in procs:  # only reached early on an error of our own
            if proc.exitcode is None and proc.pid is not None:
                proc.terminate()
                proc.join(30)
    return 0 if all(proc.exitcode == 0 for proc in procs) else 1
