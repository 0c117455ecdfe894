"""`LocalConnector`: workers as `stator worker` processes on this host.

Each (pool, role) has a command line (the worker flags, without the namespace and role:
those are added). A new worker gets the next free GPU ids (`CUDA_VISIBLE_DEVICES`) from
`gpus`, `gpus_per_worker` at a time; without GPU ids none is set. Scale-down sends
SIGTERM to the newest workers: a stator worker then leaves discovery, finishes its
in-flight requests (up to its `--graceful-shutdown-timeout`) and exits, so no request
fails. Processes that exit on their own are noticed and replaced at the next `scale`.

`worker_seconds()` is the fleet's cost: the time each worker process lived, summed. A
worker's life ends when its process exits (watched through a pidfd where Linux has one),
not when the connector next looks: a drained worker used to be charged until the
planner's next tick, up to an interval more than it lived.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


def _die_with_parent() -> None:
    """In the child: SIGTERM it (a drain) when the connector's process dies (Linux), so a
    crashed planner leaves no workers behind."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class WorkerProcess:
    pool: str
    role: str
    proc: subprocess.Popen
    gpus: list[str]
    started: float
    stopped: float | None = None
    draining: bool = False
    exited: float | None = None  # when the process exited, if watched

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class LocalConnector:
    # (pool, role) -> worker flags, e.g. ["--engine", "mocker", "--model", "m"]
    commands: dict[tuple[str, str], list[str]]
    gpus: list[str] = field(default_factory=list)
    gpus_per_worker: int = 1
    log_dir: Path | None = None
    env: dict[str, str] | None = None
    python: str = sys.executable
    workers: list[WorkerProcess] = field(default_factory=list)
    _clock_start: float = field(default_factory=time.monotonic)
    _exit_watches: dict[int, tuple[asyncio.AbstractEventLoop, int]] = field(default_factory=dict)

    def _live(self, pool: str, role: str) -> list[WorkerProcess]:
        return [
            w
            for w in self.workers
            if w.pool == pool and w.role == role and w.alive and not w.draining
        ]

    async def current(self, pool: str, role: str) -> int:
        self._reap()
        return len(self._live(pool, role))

    def _free_gpus(self) -> list[str]:
        used = {g for w in self.workers if w.alive for g in w.gpus}
        return [g for g in self.gpus if g not in used]

    def _start(self, pool: str, role: str) -> WorkerProcess:
        key = (pool, role)
        if key not in self.commands:
            raise KeyError(f"no worker command for pool {pool!r} role {role!r}")
        gpus: list[str] = []
        env = dict(self.env if self.env is not None else os.environ)
        if self.gpus:
            free = self._free_gpus()
            if len(free) < self.gpus_per_worker:
                raise RuntimeError(f"no free GPUs for another {role} worker of {pool}")
            gpus = free[: self.gpus_per_worker]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        args = [self.python, "-m", "stator", "worker", *self.commands[key], "--namespace", pool]
        if role != "aggregated":
            args += ["--role", role]
        out = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            n = sum(1 for w in self.workers if w.pool == pool and w.role == role)
            out = (self.log_dir / f"{pool}-{role}-{n}.log").open("wb")
        proc = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        if out is not subprocess.DEVNULL:
            out.close()  # the child holds its own copy
        worker = WorkerProcess(pool, role, proc, gpus, time.monotonic())
        self.workers.append(worker)
        self._watch_exit(worker)
        log.info("started %s worker of pool %s (pid %d, gpus %s)", role, pool, proc.pid, gpus)
        return worker

    def _watch_exit(self, worker: WorkerProcess) -> None:
        """Stamp `worker.exited` the moment its process exits: a pidfd turns readable then.
        Without a pidfd (not Linux, or no running loop) the exit is stamped when `_reap`
        first sees it."""
        try:
            loop = asyncio.get_running_loop()
            fd = os.pidfd_open(worker.proc.pid)
        except (AttributeError, OSError, RuntimeError):
            return

        def exited() -> None:
            worker.exited = time.monotonic()
            self._unwatch(worker.proc.pid)

        self._exit_watches[worker.proc.pid] = (loop, fd)
        loop.add_reader(fd, exited)

    def _unwatch(self, pid: int) -> None:
        watch = self._exit_watches.pop(pid, None)
        if watch is not None:
            loop, fd = watch
            if not loop.is_closed():
                loop.remove_reader(fd)
            os.close(fd)

    def _drain(self, worker: WorkerProcess) -> None:
        worker.draining = True
        with contextlib.suppress(ProcessLookupError):
            worker.proc.send_signal(signal.SIGTERM)
        log.info(
            "draining %s worker of pool %s (pid %d)", worker.role, worker.pool, worker.proc.pid
        )

    def _reap(self) -> None:
        now = time.monotonic()
        for w in self.workers:
            if w.stopped is None and not w.alive:
                w.stopped = w.exited if w.exited is not None else now
                if not w.draining:
                    log.warning(
                        "%s worker of pool %s (pid %d) exited with %s",
                        w.role, w.pool, w.proc.pid, w.proc.returncode,
                    )  # fmt: skip

    async def scale(self, pool: str, role: str, desired: int) -> None:
        self._reap()
        live = self._live(pool, role)
        for _ in range(desired - len(live)):
            self._start(pool, role)
        for worker in (
            sorted(live, key=lambda w: w.started)[desired:] if desired < len(live) else []
        ):
            self._drain(worker)

    def worker_seconds(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self._reap()
        return sum((w.stopped or now) - w.started for w in self.workers)

    async def close(self, grace: float = 30.0) -> None:
        """Drain every worker and wait for them (kill the ones still there after `grace`)."""
        for w in self.workers:
            if w.alive and not w.draining:
                self._drain(w)
        deadline = time.monotonic() + grace
        while any(w.alive for w in self.workers) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        for w in self.workers:
            if w.alive:
                w.proc.kill()
                w.proc.wait()
        self._reap()
        for pid in list(self._exit_watches):
            self._unwatch(pid)
