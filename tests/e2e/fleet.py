"""Real stator processes for end-to-end tests: `stator frontend`, `stator worker` and
`stator run`, each on free loopback ports, always killed at the end."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path

import httpx

from tests.procs import free_port, repo_env, stator_process

BUNDLED = Path(__file__).resolve().parents[2] / "stator" / "models" / "tiny-chat"


class StatorProcess:
    def __init__(self, args: list[str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self.log = log_path.open("wb")
        self.proc = stator_process(*args, env=repo_env(), stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.log.close()


class Fleet:
    """Processes of one test; `close()` kills whatever is still running."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[StatorProcess] = []

    def start(self, name: str, *args: str) -> StatorProcess:
        proc = StatorProcess(list(args), self.workdir / f"{name}-{len(self.procs)}.log")
        self.procs.append(proc)
        return proc

    def frontend(self, discovery: str, event_plane: str, *extra: str) -> tuple[StatorProcess, str]:
        port = free_port()
        proc = self.start(
            "frontend", "frontend", "--discovery", discovery, "--event-plane", event_plane,
            "--discovery-ttl", "2", "--http-host", "127.0.0.1", "--http-port", str(port), *extra,
        )  # fmt: skip
        return proc, f"http://127.0.0.1:{port}"

    def mocker_worker(self, discovery: str, event_plane: str, *extra: str) -> StatorProcess:
        return self.start(
            "worker", "worker", "--engine", "mocker", "--model", str(BUNDLED),
            "--served-model-name", "tiny", "--discovery", discovery, "--event-plane", event_plane,
            "--discovery-ttl", "2", "--graceful-shutdown-timeout", "30", *extra,
        )  # fmt: skip

    def close(self) -> None:
        for proc in self.procs:
            proc.stop()


def wait_until(check, timeout: float, what: str, procs: list[StatorProcess] = ()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if check():
                return
        for p in procs:
            if not p.alive():
                raise AssertionError(f"{p.args[0]} exited early:\n{p.output()[-3000:]}")
        time.sleep(0.1)
    logs = "\n".join(p.output()[-2000:] for p in procs)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")


def live_instances(base_url: str, model: str) -> list[str]:
    resp = httpx.get(f"{base_url}/health", timeout=5)
    return resp.json().get("instances", {}).get(model, [])
