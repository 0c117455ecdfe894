"""The model-cache path of the manifests, run for real on this machine: the download Job's
own script (from the rendered manifest) runs `stator download` into an HF_HOME like the
PVC's, and the worker's init container waits for the marker it writes. Offline: with the
model not cached, the Job fails at the network call with a clear error; with it cached, the
Job writes the marker, the init container passes and the worker resolves the same files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.manifests import DEPLOY, config_maps, render
from tests.procs import REPO

BASE = DEPLOY / "kubernetes" / "base"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _container(kind: str, name: str, container: str) -> tuple[dict, dict]:
    obj = next(o for o in render(BASE) if o["kind"] == kind and o["metadata"]["name"] == name)
    spec = obj["spec"]["template"]["spec"]
    every = [*spec.get("initContainers", []), *spec["containers"]]
    return next(c for c in every if c["name"] == container), spec


def _env(c: dict, cache: Path, tmp: Path) -> dict[str, str]:
    """The container's environment as Kubernetes would set it, with the PVC at `cache`
    and a `stator` on PATH that runs this checkout."""
    cms = config_maps(BASE)
    env = {"PATH": f"{tmp / 'bin'}:{os.environ['PATH']}", "HOME": str(tmp)}
    for ref in c.get("envFrom", []):
        env.update(cms[ref["configMapRef"]["name"]])
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"].replace("/model-cache", str(cache))
    env["HF_HUB_OFFLINE"] = "1"  # no network in tests: the Job stops at the network call
    env["PYTHONPATH"] = str(REPO)
    return env


def _script(c: dict, cache: Path) -> str:
    assert c["command"] == ["sh", "-c"]
    return c["args"][0].replace("/model-cache", str(cache))


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    (tmp_path / "bin").mkdir()
    stator = tmp_path / "bin" / "stator"
    stator.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m stator "$@"\n')
    stator.chmod(0o755)
    return tmp_path / "model-cache"


def _fill_cache(cache: Path) -> Path:
    """What a finished `snapshot_download` leaves in HF_HOME/hub for MODEL@main."""
    repo = cache / "hf" / "hub" / ("models--" + MODEL.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "llama"}')
    (snapshot / "tokenizer.json").write_text("{}")
    return snapshot


def test_the_job_uses_stator_download_with_the_token_secret():
    c, spec = _container("Job", "stator-model-download", "download")
    assert 'stator download "$STATOR_MODEL" --revision "$STATOR_REVISION"' in c["args"][0]
    token = next(e for e in c["env"] if e["name"] == "HF_TOKEN")["valueFrom"]["secretKeyRef"]
    assert token == {"name": "hf-token", "key": "HF_TOKEN", "optional": True}
    assert spec["volumes"][0]["persistentVolumeClaim"]["claimName"] == "stator-model-cache"


def test_download_job_offline_fails_with_a_clear_error(cache: Path, tmp_path: Path):
    c, _ = _container("Job", "stator-model-download", "download")
    out = subprocess.run(
        ["sh", "-c", _script(c, cache)],
        env=_env(c, cache, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert f"cannot fetch {MODEL!r} from the Hugging Face Hub" in out.stderr
    assert not (cache / "ready").exists()  # no marker: workers keep waiting


def test_download_job_marks_a_cached_model_ready_and_workers_find_it(cache: Path, tmp_path: Path):
    snapshot = _fill_cache(cache)
    job, _ = _container("Job", "stator-model-download", "download")
    out = subprocess.run(
        ["sh", "-c", _script(job, cache)],
        env=_env(job, cache, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert str(snapshot) in out.stdout  # `stator download` prints the path
    assert (cache / "ready" / f"{MODEL}@main").is_file()

    wait, _ = _container("Deployment", "stator-worker", "wait-for-model")
    out = subprocess.run(
        ["sh", "-c", _script(wait, cache)], env=_env(wait, cache, tmp_path), timeout=30
    )
    assert out.returncode == 0

    # The worker (HF_HUB_OFFLINE=1, STATOR_MODEL/STATOR_REVISION from its ConfigMap) resolves
    # the model to the snapshot the Job cached, through `stator worker`'s own code.
    worker, _ = _container("Deployment", "stator-worker", "worker")
    code = (
        "from stator.cli.worker import worker_model_dir\n"
        "from stator.config import from_env\n"
        "from stator.worker.config import WorkerConfig\n"
        "from stator.worker.model_resolution import DownloadConfig\n"
        "print(worker_model_dir(from_env(WorkerConfig), from_env(DownloadConfig)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(worker, cache, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(snapshot.resolve())
