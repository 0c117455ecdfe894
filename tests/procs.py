"""Helpers for tests that start stator processes: they run this checkout's code (not an
installed copy), on free loopback ports, and are always killed at the end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def repo_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def stator_process(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """Start `python -m stator ARGS` from this checkout."""
    return subprocess.Popen(
        [sys.executable, "-m", "stator", *args],
        env=env or repo_env(),
        cwd=REPO,
        **kwargs,
    )


def wait_healthy(proc: subprocess.Popen, port: int, timeout: float = 90.0) -> None:
    """Poll `GET /health` on a started `stator run`/`stator frontend` until it answers 200;
    fail the test if the process exits first or the timeout passes."""
    import httpx  # a test dependency; only the tests that start servers need it

    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None, f"stator exited early with code {proc.returncode}"
        assert time.monotonic() < deadline, f"stator never became healthy on port {port}"
        time.sleep(0.3)


def child_pids(pid: int) -> list[int]:
    """The PIDs whose parent is `pid` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # the process exited while we looked
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out
