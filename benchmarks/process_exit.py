"""How long a `stator frontend` takes to exit after SIGTERM with streams in flight.

Starts a frontend (`--processor stator` or `vllm`) and a mocker worker on file discovery,
keeps 16 clients streaming 200-token chats for 8 s, sends the frontend SIGTERM and times
until the process is gone (its drain, then its exit). Run it with the vLLM venv's python
for `--processor vllm`. `--checkout` picks the stator tree to run (A/B against an older
one: `git archive <commit> | tar -x -C /tmp/old`).

    python benchmarks/process_exit.py --processor vllm --rounds 2
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def one_round(processor: str, workdir: Path) -> float:
    from tests.e2e.fleet import Fleet, live_instances, wait_until
    from tests.model_factory import make_model_dir

    model = make_model_dir(workdir / "model")
    fleet = Fleet(workdir)
    discovery = f"file:{workdir / 'discovery'}"
    try:
        frontend, url = fleet.frontend(discovery, "zmq", "--processor", processor)
        worker = fleet.start(
            "worker", "worker", "--engine", "mocker", "--model", str(model),
            "--served-model-name", "m", "--discovery", discovery, "--event-plane", "zmq",
        )  # fmt: skip
        wait_until(
            lambda: len(live_instances(url, "m")) == 1, 300, "the worker", [frontend, worker]
        )
        stop = threading.Event()
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "hello " * 50}],
            "max_tokens": 200,
            "stream": True,
            "ignore_eos": True,
        }

        def client() -> None:
            with httpx.Client(timeout=60) as http:
                while not stop.is_set():
                    try:
                        with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                            for _ in r.iter_lines():
                                pass
                    except httpx.HTTPError:
                        time.sleep(0.05)

        clients = [threading.Thread(target=client, daemon=True) for _ in range(16)]
        for thread in clients:
            thread.start()
        time.sleep(8)
        began = time.monotonic()
        frontend.signal(signal.SIGTERM)
        code = frontend.wait(120)
        took = time.monotonic() - began
        stop.set()
        assert code == 0, frontend.output()[-3000:]
        return took
    finally:
        for proc in fleet.procs:
            proc.signal(signal.SIGTERM)
        for proc in fleet.procs:
            proc.wait(60)
        fleet.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processor", choices=["stator", "vllm"], default="stator")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--checkout", type=Path, default=REPO, help="stator tree to run")
    args = parser.parse_args()
    sys.path.insert(0, str(args.checkout))
    import tests.procs

    tests.procs.REPO = args.checkout  # the processes run that tree's code
    for n in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="stator-exit-") as tmp:
            took = one_round(args.processor, Path(tmp))
        print(f"round {n + 1}: --processor {args.processor} exited {took:.2f}s after SIGTERM")


if __name__ == "__main__":
    main()
