"""Every script under benchmarks/ imports (a removed helper that one script still imported,
`native_gpu_serve.start`, broke `kv_offload_gpu.py` unnoticed: GPU scripts never run in CI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_every_benchmark_script_imports():
    # One interpreter imports them all (torch once); it prints the names that failed.
    names = sorted(p.stem for p in BENCHMARKS.glob("*.py"))
    code = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(BENCHMARKS)!r})\n"
        "failed = []\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print('\\n'.join(failed))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=BENCHMARKS.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", out.stdout
    assert len(names) > 20
