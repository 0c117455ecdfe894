"""Helpers for tests that start stator processes: they run this checkout's code (not an
installed copy), on free loopback ports, and are always killed at the end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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
