"""`stator frontend --api-server-count N`: N frontend processes on one port (SO_REUSEPORT);
one dying leaves the others serving; bad values and a taken port are clear errors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from stator.frontend.http.api_servers import ApiServerConfig, reuse_port_socket
from tests.e2e.fleet import Fleet, live_instances, wait_until
from tests.procs import child_pids, repo_env


def _frontend(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stator", "frontend", "--http-host", "127.0.0.1", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env or repo_env(),
    )


@pytest.mark.parametrize("count", [0, -3])
def test_a_count_below_one_is_rejected(count):
    with pytest.raises(ValueError, match="at least 1"):
        ApiServerConfig(api_server_count=count).validate()
    ApiServerConfig(api_server_count=1).validate()


def test_the_cli_refuses_a_bad_count_with_a_clear_error():
    result = _frontend("--api-server-count", "0")
    assert result.returncode == 2
    assert "--api-server-count must be at least 1, got 0" in result.stderr
    result = _frontend(env=repo_env(STATOR_API_SERVER_COUNT="-1"))
    assert result.returncode == 2
    assert "got -1" in result.stderr
    result = _frontend("--api-server-count", "two")
    assert result.returncode == 2
    assert "invalid int value" in result.stderr


def test_a_port_held_by_another_program_fails_once_and_clearly():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(OSError):
            reuse_port_socket("127.0.0.1", port)
        result = _frontend("--api-server-count", "2", "--http-port", str(port))
    assert result.returncode == 1
    assert f"cannot bind 127.0.0.1:{port}" in result.stderr


def test_port_zero_resolves_to_one_port_that_others_can_share():
    with reuse_port_socket("127.0.0.1", 0) as held:
        port = held.getsockname()[1]
        assert port != 0
        with reuse_port_socket("127.0.0.1", port) as second:  # what each server does
            second.listen()


def _listening_pids(port: int, candidates: list[int]) -> set[int]:
    """Which of `candidates` hold a TCP socket listening on `port` (Linux /proc)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
            inodes.add(f"socket:[{fields[9]}]")
    holders = set()
    for pid in candidates:
        fd_dir = Path(f"/proc/{pid}/fd")
        try:
            if any(os.readlink(fd_dir / fd) in inodes for fd in os.listdir(fd_dir)):
                holders.add(pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return holders


def _chat(url: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    # A new connection per call: the kernel picks a listening socket per connection.
    with httpx.Client(timeout=60) as client:
        resp = client.post(f"{url}/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 4


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux /proc")
def test_two_servers_share_the_port_and_one_dying_leaves_the_other_serving(tmp_path):
    fleet = Fleet(tmp_path)
    try:
        discovery = f"file:{tmp_path / 'discovery'}"
        supervisor, url = fleet.frontend(
            discovery, "zmq", "--api-server-count", "2", "--router-mode", "least-loaded"
        )
        port = int(url.rsplit(":", 1)[1])
        worker = fleet.mocker_worker(discovery, "zmq", "--speedup-ratio", "10")
        procs = [supervisor, worker]
        wait_until(lambda: len(live_instances(url, "tiny")) == 1, 90, "the worker", procs)

        def both_listening() -> bool:
            return len(_listening_pids(port, child_pids(supervisor.proc.pid))) == 2

        wait_until(both_listening, 60, "two listening frontend processes", procs)
        servers = sorted(_listening_pids(port, child_pids(supervisor.proc.pid)))
        # Both serve: every server has its own router, and each must see the worker.
        for _ in range(12):
            _chat(url)
        # least-loaded reads booked load, so the servers share it.
        assert "turning on --router-replica-sync" in supervisor.output()

        os.kill(servers[0], signal.SIGKILL)
        wait_until(
            lambda: _listening_pids(port, servers) == {servers[1]}, 30, "the kill", [supervisor]
        )
        for _ in range(12):
            _chat(url)
        assert supervisor.alive()
        assert f"(pid {servers[0]}) exited with -9; 1 still serving" in supervisor.output()

        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(60) == 1  # one server did not exit cleanly
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{servers[1]}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{servers[1]}"), "the survivor outlived the supervisor"
        assert f"(pid {servers[1]}) exited with 0" in supervisor.output()
    finally:
        fleet.close()


def test_replica_sync_is_on_only_where_the_router_reads_load():
    from stator.cli.frontend import _router_reads_load
    from stator.router import RouterConfig

    assert not _router_reads_load(RouterConfig())  # round-robin
    assert not _router_reads_load(RouterConfig(router_mode="random"))
    for mode in ("power-of-two", "least-loaded", "kv"):
        assert _router_reads_load(RouterConfig(router_mode=mode))
    assert _router_reads_load(RouterConfig(active_prefill_tokens_threshold=4096))
    assert _router_reads_load(RouterConfig(active_decode_blocks_threshold=0.9))
