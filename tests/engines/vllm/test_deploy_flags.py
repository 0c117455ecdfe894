"""The vLLM engine's flags in deploy/ manifests (the multi-node LeaderWorkerSet workers)
exist in `stator worker --engine vllm --help`, vLLM's pass-through engine arguments
included. Runs in the vLLM venv (.ci/vllm.sh); tests/deploy/test_flags.py checks every other
stator command in the manifests."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here (run .ci/vllm.sh)")

from tests.deploy.manifests import rel, render_targets, stator_calls
from tests.deploy.test_flags import unknown_flags

CALLS = [
    call
    for target in render_targets()
    for call in stator_calls(target)
    if call.subcommand == ["worker"] and call.flag_value("--engine") == "vllm"
]


def test_some_manifest_runs_the_vllm_engine():
    assert CALLS, "no manifest runs `stator worker --engine=vllm`"


@pytest.mark.parametrize("call", CALLS, ids=lambda c: c.where)
def test_every_vllm_worker_flag_exists(call):
    assert unknown_flags(call) == [], rel
