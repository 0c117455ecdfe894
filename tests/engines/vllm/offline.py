"""vLLM's own offline `LLM.generate`, the reference the engine tests compare stator's
streams with, served by one child process for the whole session.

A child process because vLLM's spawn wants a `__main__`; one for the session because
each start imports vLLM again (12 CPU-seconds) and builds the engine again. The child
keeps the last model's `LLM` (the llama tests ask twice in a row) and frees it before
loading another. Requests and answers are JSON lines; vLLM's own log lines on stdout are
skipped.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import gc, json, os, sys, traceback
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import EmbedsPrompt, TokensPrompt

    def main():
        loaded, llm = None, None
        for line in sys.stdin:
            ask = json.loads(line)
            try:
                key = (ask["model"], ask["dtype"], ask["embeds"])
                if key != loaded:
                    llm, loaded = None, None
                    gc.collect()
                    llm = LLM(model=ask["model"], enforce_eager=True, max_model_len=1024,
                              dtype=ask["dtype"], enable_prefix_caching=False,
                              enable_prompt_embeds=ask["embeds"])
                    loaded = key
                params = SamplingParams(
                    temperature=0, max_tokens=ask["max_tokens"], ignore_eos=True
                )
                inputs = [
                    EmbedsPrompt(prompt_embeds=torch.load(p, weights_only=True))
                    if isinstance(p, str) else TokensPrompt(prompt_token_ids=p)
                    for p in ask["prompts"]
                ]
                out = llm.generate(inputs, params)
                answer = [list(o.outputs[0].token_ids) for o in out]
                print("RESULT " + json.dumps(answer), flush=True)
            except Exception:
                print("ERROR " + json.dumps(traceback.format_exc()), flush=True)

    if __name__ == "__main__":
        main()
        os._exit(0)  # freeing vLLM's modules takes seconds and there is nothing to keep
    """
)

# Seconds one request may take (loading a model included), on a busy 2-core machine.
REQUEST_TIMEOUT = 600.0


class OfflineVllm:
    def __init__(self, workdir: Path) -> None:
        script = workdir / "offline_vllm.py"
        script.write_text(CHILD)
        self.log_path = workdir / "offline_vllm.log"
        self._log = self.log_path.open("wb")
        self._lock = threading.Lock()
        self._pending = b""
        self.proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0"),
        )

    def greedy_many(
        self,
        model_dir: Path,
        prompts: list[list[int] | Path],
        max_tokens: int,
        dtype: str = "float32",
        prompt_embeds: bool = False,
    ) -> list[list[int]]:
        """Greedy completions (EOS ignored) of each prompt: token ids, or the path of a
        `torch.save`d embeddings tensor (which needs `prompt_embeds`, as the engine
        under test has it)."""
        ask = {
            "model": str(model_dir),
            "dtype": dtype,
            "embeds": prompt_embeds or any(isinstance(p, Path) for p in prompts),
            "prompts": [str(p) if isinstance(p, Path) else p for p in prompts],
            "max_tokens": max_tokens,
        }
        with self._lock:
            self.proc.stdin.write((json.dumps(ask) + "\n").encode())
            self.proc.stdin.flush()
            deadline = time.monotonic() + REQUEST_TIMEOUT
            while True:
                line = self._read_line(deadline)
                if line.startswith("RESULT "):
                    return json.loads(line.removeprefix("RESULT "))
                if line.startswith("ERROR "):
                    raise AssertionError(f"offline vLLM failed:\n{json.loads(line[6:])}")

    def greedy(
        self, model_dir: Path, prompt: list[int], max_tokens: int, dtype: str = "float32", **kw
    ) -> list[int]:
        return self.greedy_many(model_dir, [prompt], max_tokens, dtype, **kw)[0]

    def _read_line(self, deadline: float) -> str:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"offline vLLM gave no answer in {REQUEST_TIMEOUT}s")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    tail = self.log_path.read_text(errors="replace")[-3000:]
                    raise AssertionError(f"offline vLLM exited ({self.proc.wait()}):\n{tail}")
                self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode(errors="replace")

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
