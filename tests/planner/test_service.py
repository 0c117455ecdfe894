"""The planner process's loop in process: a real frontend (mem discovery) with a scripted
worker, the frontend's /metrics scraped, the pure planner ticked, a recording connector;
the recorded observations replay (`stator planner --replay`) to the same decisions."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import msgspec

from stator.frontend import running_frontend
from stator.planner.config import PlannerConfig
from stator.planner.observe import FrontendScraper
from stator.planner.profile import PerfProfile
from stator.planner.service import PlannerService, PlannerServiceConfig
from stator.protocols import EngineRequest, LoadReport
from stator.runtime import Runtime, RuntimeConfig
from tests.fakes import ScriptedEngine
from tests.frontend.harness import engine_handler
from tests.procs import REPO, repo_env

DISCOVERY = "mem:planner-service"


class RecordingConnector:
    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.calls: list[tuple[str, str, int]] = []

    async def current(self, pool: str, role: str) -> int:
        return self.counts.get((pool, role), 0)

    async def scale(self, pool: str, role: str, desired: int) -> None:
        self.calls.append((pool, role, desired))
        self.counts[(pool, role)] = desired

    async def close(self) -> None:
        pass


def profile() -> PerfProfile:
    return PerfProfile(
        prefill_tokens=[1, 10000], prefill_ms=[100, 1100], batch_sizes=[1, 64],
        contexts=[1, 10000], decode_ms=[[20, 20], [60, 60]], max_num_seqs=64,
        max_kv_tokens=10**6,
    )  # fmt: skip


async def test_the_loop_observes_decides_scales_and_records(tmp_path, tiny_model_dir):
    worker = await Runtime.create(RuntimeConfig(discovery=DISCOVERY))
    engine = ScriptedEngine("tiny", source_path=str(tiny_model_dir), script=list(range(5, 13)))
    engine.worker_id = worker.instance_id
    await engine.start()
    await worker.serve("stator.backend.generate", engine_handler(engine), EngineRequest)
    await worker.publish_model_card("stator.backend.generate", engine.model_card())
    front = await Runtime.create(RuntimeConfig(discovery=DISCOVERY))
    record = tmp_path / "observations.jsonl"
    config = PlannerConfig(
        profile="unused", ttft_target=400, itl_target=50, min_workers=1, correction=False,
        load_predictor="constant",
    )  # fmt: skip
    service_config = PlannerServiceConfig(connector="none", record=str(record))
    connector = RecordingConnector()
    async with running_frontend(front) as frontend:
        await frontend.manager.wait_for_model("tiny")
        planner = PlannerService(
            config,
            service_config,
            RuntimeConfig(discovery=DISCOVERY),
            connector,
            FrontendScraper([frontend.base_url], model="tiny"),
            profile(),
        )
        await planner.start()
        try:
            assert connector.calls == [("stator", "aggregated", 1)]  # brought to the minimum
            await planner.reader.read()  # the baseline
            await worker.publish(
                "load",
                LoadReport(worker_id=worker.instance_id, active_kv_blocks=10, total_kv_blocks=100),
            )
            async with httpx.AsyncClient(base_url=frontend.base_url, timeout=30) as http:
                for _ in range(30):
                    body = {"model": "tiny", "prompt": "hi there", "max_tokens": 8}
                    assert (await http.post("/v1/completions", json=body)).status_code == 200
            (decision,) = await planner.step(interval=1.0)
            (seen,) = planner.observations[-1].roles
            assert seen.requests == 30 and seen.ready == 1 and seen.osl >= 1
            assert seen.loads[0].kv_usage == 0.1
            # 30 req/s of ~3-token prompts at ~200 ms prefill each: several workers
            assert decision.desired > 1 and decision.predicted_rps == 30
            assert connector.calls[-1] == ("stator", "aggregated", decision.desired)
        finally:
            await planner.close()
    await worker.shutdown()
    await front.shutdown()

    profile_path = tmp_path / "p.json"
    profile().save(profile_path)
    cmd = [
        sys.executable, "-m", "stator", "planner", "--replay", str(record), "--profile",
        str(profile_path), "--ttft-target", "400", "--itl-target", "50", "--no-correction",
        "--load-predictor", "constant",
    ]  # fmt: skip
    done = subprocess.run(cmd, env=repo_env(), cwd=REPO, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    (line,) = done.stdout.decode().splitlines()
    replayed = json.loads(line)
    assert replayed["desired"] == decision.desired
    assert msgspec.json.decode(line.encode())["reason"] == decision.reason
