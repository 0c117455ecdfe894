"""`stator run --engine native` on a GPU, measured through HTTP with `stator bench`.

Serves (1) the bundled tiny-chat model and checks that it answers, and (2) a
Llama-3.1-8B-shaped model with random weights (`--load-format dummy`, bf16; the bundled
tokenizer, so its vocabulary is 4096 instead of 128k), and measures TTFT / ITL / output
throughput at concurrency 1 and 16 with `stator bench`'s load generator.

    python benchmarks/native_gpu_serve.py            # on the device; prints a table
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stator_http import launch  # noqa: E402

from stator.bench.config import BenchConfig  # noqa: E402
from stator.bench.runner import run_benchmark  # noqa: E402

BUNDLED = REPO / "stator" / "models" / "tiny-chat"
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def make_8b_dir(root: Path) -> Path:
    out = root / "llama-8b-shape"
    out.mkdir(exist_ok=True)  # a script's engine-alone subprocess writes the same directory
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (BUNDLED / name).exists():
            shutil.copy(BUNDLED / name, out / name)
    tiny = json.loads((BUNDLED / "config.json").read_text())
    config = {
        **LLAMA_8B,
        "vocab_size": tiny["vocab_size"],
        "bos_token_id": tiny.get("bos_token_id"),
        "eos_token_id": tiny.get("eos_token_id"),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def chat(url: str, model: str, text: str, max_tokens: int) -> dict:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
    ).encode()
    req = urllib.request.Request(
        f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


def bench(url: str, concurrency: int, requests: int, isl: int, osl: int) -> dict:
    cfg = BenchConfig(
        url=url,
        tokenizer=str(BUNDLED),
        isl=isl,
        osl=osl,
        concurrency=concurrency,
        num_requests=requests,
        warmup=2,
        progress=False,
    )
    return asyncio.run(run_benchmark(cfg)).points[0].summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        proc, url = launch(["--device", args.device], root / "tiny.log", timeout=600)
        try:
            answer = chat(url, "tiny-chat", "And God said", 24)
            text = answer["choices"][0]["message"]["content"]
            print(f"tiny-chat on {args.device}: {text!r}")
            assert answer["usage"]["completion_tokens"] == 24 and text.strip()
        finally:
            proc.terminate()
            proc.wait(60)
        model_dir = make_8b_dir(root)
        proc, url = launch(
            [
                "--device",
                args.device,
                "--model",
                str(model_dir),
                "--load-format",
                "dummy",
                "--dtype",
                "bfloat16",
            ],
            root / "8b.log",
            timeout=600,
        )
        try:
            for conc, n, isl, osl in ((1, 6, 128, 256), (1, 6, 1024, 16), (16, 48, 128, 128)):
                s = bench(url, conc, n, isl, osl)
                rows.append(
                    {
                        "concurrency": conc,
                        "requests": n,
                        "isl": isl,
                        "osl": osl,
                        "ok": s["successful_requests"],
                        "ttft_p50_ms": s["time_to_first_token"].get("p50"),
                        "itl_p50_ms": s["inter_token_latency"].get("p50"),
                        "output_tok_s": s["output_token_throughput"]["avg"],
                    }
                )
        finally:
            proc.terminate()
            proc.wait(60)
            shutil.copy(root / "8b.log", Path(args.out) / "stator_run_8b.log")
    Path(args.out, "native_gpu_serve.json").write_text(json.dumps(rows, indent=2))
    print("| concurrency | requests | ISL | OSL | ok | TTFT p50 ms | ITL p50 ms | output tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['concurrency']} | {r['requests']} | {r['isl']} | {r['osl']} | {r['ok']} | "
            f"{r['ttft_p50_ms']:.1f} | {r['itl_p50_ms']:.2f} | {r['output_tok_s']:.0f} |"
        )


if __name__ == "__main__":
    main()
