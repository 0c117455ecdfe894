"""Every `stator` flag a manifest uses exists: each flag of each `stator ...` command in a
rendered pod is in that subcommand's `--help` (with the engine the command names), and each
STATOR_* variable a pod sets is the env twin of a flag of the stator command reading it."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest

from tests.deploy.manifests import (
    StatorCall,
    config_maps,
    flag_of_env,
    help_flags,
    rel,
    render_targets,
    stator_calls,
)

# PENDING: flags (or whole subcommands, "*") that manifests use and that other issues are
# adding to stator right now. Checked when present; skipped while missing. A test warns
# when an entry has landed: delete it then.
#   key: (subcommand words, flag)
PENDING: dict[tuple[str, str], str] = {
}
# Pods of the vLLM engine (LeaderWorkerSet multi-node) pass vLLM's own engine arguments; they
# are checked in the vLLM venv (tests/engines/vllm/test_deploy_flags.py).
VLLM = importlib.util.find_spec("vllm") is not None

TARGETS = render_targets()


def _engine(call: StatorCall) -> str | None:
    if call.subcommand[0] not in ("worker", "run"):
        return None
    return call.flag_value("--engine") or "native"


def _available(call: StatorCall) -> frozenset[str] | None:
    """The flags of the call's subcommand, or None when the whole subcommand is pending."""
    words = tuple(call.subcommand)
    if (" ".join(words), "*") in PENDING:
        try:
            return help_flags(words, _engine(call))
        except AssertionError:
            return None
    return help_flags(words, _engine(call))


def unknown_flags(call: StatorCall) -> list[str]:
    available = _available(call)
    if available is None:
        return []
    sub = " ".join(call.subcommand)
    return [f for f in call.flags if f not in available and (sub, f) not in PENDING]


@pytest.mark.parametrize("target", TARGETS, ids=rel)
def test_every_stator_flag_in_a_manifest_exists(target: Path):
    problems = []
    for call in stator_calls(target):
        if _engine(call) == "vllm" and not VLLM:
            continue  # vLLM's flags: tests/engines/vllm/test_deploy_flags.py
        problems += [
            f"{call.where}: stator {' '.join(call.subcommand)} {f}" for f in unknown_flags(call)
        ]
    assert not problems, "flags no stator subcommand has:\n" + "\n".join(problems)


@pytest.mark.parametrize("target", TARGETS, ids=rel)
def test_every_stator_env_var_is_a_flag_of_its_reader(target: Path):
    """A STATOR_* key in `env:` is a flag of that container's command; one in a ConfigMap
    read with envFrom is a flag of at least one stator command that reads the ConfigMap."""
    cms = config_maps(target)
    readers: dict[str, list[StatorCall]] = {}
    problems = []
    for call in stator_calls(target):
        if _engine(call) == "vllm" and not VLLM:
            continue
        available = _available(call)
        if available is None:
            continue
        for key in call.env_keys:
            if flag_of_env(key) not in available:
                problems.append(f"{call.where}: env {key} is no flag of stator {call.subcommand}")
        for name in call.env_from:
            readers.setdefault(name, []).append(call)
    for name, calls in readers.items():
        for key in cms.get(name, {}):
            if not key.startswith("STATOR_"):
                continue
            flag = flag_of_env(key)
            if not any(flag in (_available(c) or {flag}) for c in calls):
                problems.append(f"ConfigMap {name}: {key} is a flag of none of its readers")
    assert not problems, "\n".join(problems)


def test_the_manifests_call_stator():
    subcommands = {" ".join(c.subcommand) for t in TARGETS for c in stator_calls(t)}
    assert {"frontend", "worker", "download", "bench run", "planner"} <= subcommands


def test_a_misspelled_flag_is_caught():
    call = StatorCall("x", ["worker", "--engine=native", "--gpu-memory-utilisation=0.9"])
    assert unknown_flags(call) == ["--gpu-memory-utilisation"]
    call = StatorCall("x", ["bench", "run", "--ready-check-timeout-sec", "5", "--concurency", "2"])
    assert unknown_flags(call) == ["--concurency"]


def test_pending_entries_have_not_landed():
    """Warns (does not fail) for each PENDING entry now on main: delete the entry."""
    landed = []
    for (sub, flag), why in PENDING.items():
        words = tuple(sub.split())
        try:
            flags = help_flags(words, "native" if words[0] == "worker" else None)
        except AssertionError:
            continue
        if flag == "*" or flag in flags:
            landed.append(f"{sub} {flag} ({why})")
    for entry in landed:
        warnings.warn(f"PENDING entry has landed, remove it: {entry}", stacklevel=1)
