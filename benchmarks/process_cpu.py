"""CPU seconds per process of a process tree (Linux /proc), to find the busiest one of a
server while a benchmark runs."""

from __future__ import annotations

import os
from pathlib import Path


def process_tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                pass
    return out


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return out


def process_name(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(c.decode(errors="replace") for c in cmd if c)
    if "core_process" in text:
        return "engine core"
    if "resource_tracker" in text:
        return "resource tracker"
    if "spawn_main" in text:
        return "api server"
    if "stator run" in text or "-m stator run" in text:
        return "stator run"
    return text[:40]
