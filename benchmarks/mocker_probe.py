"""Timing probes of one mocker worker behind its frontend: stator's or Dynamo 1.6.1's.

    python benchmarks/mocker_probe.py --system stator
    python benchmarks/mocker_probe.py --system dynamo

Where `mocker_fidelity.py` compares latency distributions under load, these probes pin
down how one engine step's time is made, with requests placed so each step's content is
known (speedup 1, 256 blocks of 64 tokens, streaming `/v1/completions` with token-id
prompts, per-token client timestamps):
- `lone<N>`: one N-token prompt at a time, 6 tokens out (does a lone prefill carry a
  decode term?).
- `conc<K>x<N>`: K concurrent N-token prompts, 60 tokens out; mean and median gap over
  tokens 10-60 (what load does the decode term see: tokens or blocks?).
- `mix`: one sequence decoding when a 1024-token prompt arrives; the decoder's gap that
  spans the prefill is that step's time (does the prefilling prompt count in the decode
  term?).
Prints one JSON object. The fleet is `routing_http.py`'s, with one worker.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import routing_http as fleets


async def stream(client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int):
    """(start time, ms from start of each content chunk) of one streamed completion."""
    body = {
        "model": fleets.MODEL, "prompt": prompt, "max_tokens": max_tokens,
        "min_tokens": max_tokens, "ignore_eos": True, "stream": True,
    }  # fmt: skip
    start = time.perf_counter()
    times = []
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data:") and "[DONE]" not in line:
                choices = json.loads(line[5:]).get("choices")
                if choices and choices[0].get("text") is not None:
                    times.append(time.perf_counter())
    return start, [round((t - start) * 1000, 1) for t in times]


async def probes(url: str) -> dict:
    rng = random.Random(1)
    prompt = lambda n: [rng.randrange(100, 1900) for _ in range(n)]  # noqa: E731
    out: dict = {}
    async with httpx.AsyncClient(timeout=120) as client:
        await stream(client, url, prompt(8), 2)  # warm-up
        await asyncio.sleep(0.5)
        for n in (64, 1024, 4096):
            runs = []
            for _ in range(3):
                runs.append((await stream(client, url, prompt(n), 6))[1])
                await asyncio.sleep(0.3)
            out[f"lone{n}"] = runs
        for k, n in ((8, 65), (8, 1000)):
            runs = await asyncio.gather(*[stream(client, url, prompt(n), 60) for _ in range(k)])
            gaps = sorted(b - a for _, ts in runs for a, b in itertools.pairwise(ts[10:]))
            out[f"conc{k}x{n}"] = {
                "ttft": [ts[0] for _, ts in runs],
                "itl_p50": round(gaps[len(gaps) // 2], 2),
                "itl_mean": round(sum(gaps) / len(gaps), 2),
            }
            await asyncio.sleep(0.5)
        decoder = asyncio.create_task(stream(client, url, prompt(64), 40))
        await asyncio.sleep(0.1)
        arrival = await stream(client, url, prompt(1024), 4)
        (start, decoder_times), (arrived, arrival_times) = await decoder, arrival
        out["mix"] = {
            "decoder": decoder_times,
            "arrival_offset_ms": round((arrived - start) * 1000, 1),
            "arrival": arrival_times,
            "widest_decoder_gap_ms": round(
                max(b - a for a, b in itertools.pairwise(decoder_times)), 1
            ),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--system", choices=sorted(fleets.SYSTEMS), default="stator")
    parser.add_argument("--kv-blocks", type=int, default=256)
    parser.add_argument("--speedup", type=float, default=1.0)
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args()
    work = Path(args.work_dir or f"/tmp/mocker_probe_{args.system}_{int(time.time())}")
    work.mkdir(parents=True, exist_ok=True)
    model = fleets.make_model_dir(work / "model", max_position_embeddings=32768)
    fleet_args = argparse.Namespace(
        workers=1, kv_blocks=args.kv_blocks, block_size=64, speedup=args.speedup,
        max_batched_tokens=8192, stator_layout="processes",
    )  # fmt: skip
    fleet = fleets.SYSTEMS[args.system]("round-robin", fleet_args, model, work)
    try:
        result = asyncio.run(probes(f"http://127.0.0.1:{fleet.port}"))
    finally:
        fleet.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
