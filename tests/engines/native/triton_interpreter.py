"""Triton kernels checked on the CPU: a check script runs in a fresh Python with
TRITON_INTERPRET=1 (the variable is read when triton is imported, so it cannot be set in
this test process, which may have imported triton already) and prints "ok" at its end."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Prepended to check scripts whose kernels index with the interpreter's 1-element scalars.
NUMPY2_INDEX_PATCH = r"""
import triton.runtime.interpreter as _interp

_patch = _interp._patch_lang_tensor


def _patched(tensor, scope):  # numpy 2 refuses int() of the interpreter's 1-element scalars
    _patch(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


_interp._patch_lang_tensor = _patched
"""


def run_interpreted(check: str, timeout: float) -> None:
    """Run `check` under Triton's interpreter; fail with its stderr unless it printed ok."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
