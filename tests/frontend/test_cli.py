"""`stator frontend` as a process: serves, answers health, exits 0 on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.procs import free_port, repo_env, stator_process


def test_frontend_help_lists_its_flags():
    out = subprocess.run(
        [sys.executable, "-m", "stator", "frontend", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env=repo_env(),
    ).stdout
    for flag in ("--http-port", "--http-host", "--router-mode", "--discovery", "STATOR_HTTP_PORT"):
        assert flag in out


@pytest.mark.integration
def test_frontend_process_serves_and_stops_cleanly():
    port = free_port()
    proc = stator_process("frontend", "--http-host", "127.0.0.1", "--http-port", str(port))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                live = httpx.get(f"http://127.0.0.1:{port}/live", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, "frontend exited early"
                assert time.monotonic() < deadline, "frontend never came up"
                time.sleep(0.2)
        assert live.status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 503
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
