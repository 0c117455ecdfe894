"""Processes for the runtime's multi-process tests: echo serving processes
(`echo_server.py`) and real etcd / NATS servers on free loopback ports. Everything
started here is killed when the test ends."""

from __future__ import annotations

import contextlib
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.procs import REPO, free_port, repo_env


class EchoProcess:
    """One `tests.runtime.echo_server` process."""

    def __init__(
        self, discovery: str, event_plane: str, workdir: Path, *, ttl: float, grace: float
    ):
        self.markers = workdir / "markers"
        self.markers.mkdir(parents=True, exist_ok=True)
        log_path = workdir / f"echo-{time.monotonic_ns()}.log"
        self.log = log_path.open("wb")
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "tests.runtime.echo_server",
                "--discovery", discovery, "--event-plane", event_plane,
                "--ttl", str(ttl), "--grace", str(grace), "--marker-dir", str(self.markers),
            ],
            env=repo_env(),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )  # fmt: skip
        self.instance_id = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"echo server exited early: {self.log_path.read_text()}")
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith(b"READY "):
                    self.instance_id = int(line.split()[1], 16)
                    return self.instance_id
        raise AssertionError(f"echo server not ready in {timeout}s: {self.log_path.read_text()}")

    def marker(self, tag: str) -> str | None:
        for how in ("done", "closed"):
            if (self.markers / f"{tag}.{how}").exists():
                return how
        return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.log.close()


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with code {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} did not listen on {port} in {timeout}s")


@contextlib.contextmanager
def etcd_server(tmp: Path, *extra: str, scheme: str = "http"):
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("etcd not installed (apt-get install etcd-server)")
    client, peer = free_port(), free_port()
    url, peer_url = f"{scheme}://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    log = (tmp / "etcd.log").open("wb")
    proc = subprocess.Popen(
        [
            binary, "--name", "test", "--data-dir", str(tmp / "etcd-data"),
            "--listen-client-urls", url, "--advertise-client-urls", url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"test={peer_url}", *extra,
        ],
        stdout=log,
        stderr=log,
    )  # fmt: skip
    try:
        _wait_port(client, proc, "etcd")
        yield f"127.0.0.1:{client}"
    finally:
        proc.kill()
        proc.wait(10)
        log.close()


@contextlib.contextmanager
def nats_server(tmp: Path, *extra: str):
    binary = shutil.which("nats-server")
    if binary is None:
        pytest.skip("nats-server not installed (apt-get install nats-server)")
    port = free_port()
    log = (tmp / "nats.log").open("wb")
    proc = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port), *extra], stdout=log, stderr=log
    )
    try:
        _wait_port(port, proc, "nats-server")
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)
        log.close()
