"""Grammar backends for structured output: token-mask time per generated token, llguidance
against xgrammar, on a 200k vocabulary (GPT-OSS's o200k_harmony) and a 128k one shaped like
Llama-3's (the first 128,000 o200k ranks + 256 specials = 128,256 ids, Llama-3's
pre-tokenizer pattern: Llama-3's own file cannot be downloaded here).

For each JSON schema a valid output is tokenized; each backend then, token by token, fills
the next-token bitmask and advances its matcher, as an engine does per decode step. Reported:
compile time (first compile, then a cached one), mask time per token (mean, p50, p99), and
llguidance's batched fill for many requests at once (its thread pool), the engine's path.

    python benchmarks/grammar_mask.py [--json out.json]

Needs `llguidance` (a stator dependency) and, for the comparison, `xgrammar`
(`pip install xgrammar`); the o200k vocabulary is built offline as the Harmony tests do
(`tests/parsers/harmony_vocab.py`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.parsers.harmony_vocab import (
    o200k_base_file,
    o200k_harmony_tokenizer_json,
)

# Llama-3's pre-tokenizer pattern (cl100k's).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SCHEMAS = {
    "tool_call": (
        {
            "type": "object",
            "properties": {
                "location": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "hourly": {"type": "boolean"},
            },
            "required": ["location", "unit", "days", "hourly"],
            "additionalProperties": False,
        },
        {"location": "San Francisco, California", "unit": "celsius", "days": 7, "hourly": True},
    ),
    "nested_record": (
        {
            "type": "object",
            "properties": {
                "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                "customer": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "email": {"type": "string", "format": "email"},
                        "tier": {"enum": ["free", "pro", "enterprise"]},
                    },
                    "required": ["name", "email", "tier"],
                    "additionalProperties": False,
                },
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string"},
                            "quantity": {"type": "integer"},
                            "price": {"type": "number"},
                        },
                        "required": ["sku", "quantity", "price"],
                        "additionalProperties": False,
                    },
                },
                "notes": {"type": ["string", "null"]},
            },
            "required": ["id", "customer", "items", "notes"],
            "additionalProperties": False,
        },
        {
            "id": "ORD-2024",
            "customer": {"name": "Ada Lovelace", "email": "ada@example.com", "tier": "pro"},
            "items": [
                {"sku": "widget-blue", "quantity": 3, "price": 19.99},
                {"sku": "gadget", "quantity": 1, "price": 249.5},
            ],
            "notes": "Leave at the front desk, please; ring twice.",
        },
    ),
    "json_object": (
        {"type": "object"},
        {"summary": "A free-form object", "scores": [1, 2.5, -3], "ok": False, "next": None},
    ),
}


def llama3_shaped_tokenizer_json() -> Path:
    target = o200k_harmony_tokenizer_json().parent / "llama3_shaped_128k.tokenizer.json"
    if target.exists():
        return target
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = o200k_base_file().read_text().splitlines()[:128000]
    truncated = target.with_suffix(".tiktoken")
    truncated.write_text("\n".join(ranks) + "\n")
    tok = TikTokenConverter(vocab_file=str(truncated), pattern=LLAMA3_PATTERN).converted()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [
        f"<|reserved_special_token_{i}|>" for i in range(254)
    ]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.save(str(target))
    return target


def output_text(value: object) -> str:
    # What the engine constrains to: compact separators with one space (grammar.py).
    return json.dumps(value, separators=(", ", ": "))


def stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "mean_us": round(statistics.fmean(ordered) * 1e6, 2),
        "p50_us": round(ordered[len(ordered) // 2] * 1e6, 2),
        "p99_us": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6, 2),
    }


def bench_llguidance(tokenizer_json: str, vocab: int, eos: int, cases, batch: int) -> dict:
    import torch

    from stator.protocols import GuidedDecoding
    from stator.structured_output.matcher import GrammarCompiler

    started = time.perf_counter()
    compiler = GrammarCompiler(tokenizer_json, vocab, [eos])
    setup = time.perf_counter() - started
    out: dict = {"tokenizer_setup_s": round(setup, 3)}
    for name, (schema, tokens) in cases.items():
        spec = GuidedDecoding(json_schema=schema)
        t0 = time.perf_counter()
        matcher = compiler.matcher(spec)
        compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiler.matcher(spec)
        cached_s = time.perf_counter() - t0
        mask = torch.full((1, compiler.words), -1, dtype=torch.int32)
        runs = []
        # Run 1: the grammar's first request (lazy lexer states get built); run 2: a later
        # request of the same cached schema, the steady state of an agent's traffic.
        for run in range(2):
            m = matcher if run == 0 else compiler.matcher(spec)
            times = []
            for token in tokens:
                t0 = time.perf_counter()
                compiler.fill([(m, 0)], mask.data_ptr(), 1)
                times.append(time.perf_counter() - t0)
                allowed = (int(mask[0, token // 32]) >> (token % 32)) & 1
                assert allowed, f"llguidance forbids token {token} of {name}"
                assert m.consume_token(token), m.get_error()
            runs.append(times)
        # The engine's path: `batch` requests at different points of the output, one fill.
        matchers = []
        for i in range(batch):
            m = compiler.matcher(spec)
            for token in tokens[: (i * 7) % len(tokens)]:
                m.consume_token(token)
            matchers.append(m)
        masks = torch.full((batch, compiler.words), -1, dtype=torch.int32)
        steps = []
        for _ in range(20):
            t0 = time.perf_counter()
            compiler.fill([(m, i) for i, m in enumerate(matchers)], masks.data_ptr(), batch)
            steps.append(time.perf_counter() - t0)
        out[name] = {
            "tokens": len(tokens),
            "compile_ms": round(compile_s * 1e3, 2),
            "cached_compile_ms": round(cached_s * 1e3, 3),
            "mask_first_request": stats(runs[0]),
            "mask": stats(runs[1]),
            f"batch{batch}_fill": stats(steps),
        }
    return out


def bench_xgrammar(tokenizer_path: Path, vocab: int, cases) -> dict:
    import transformers
    import xgrammar as xgr

    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_path))
    started = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, cache_enabled=True)
    out: dict = {"tokenizer_setup_s": round(time.perf_counter() - started, 3)}
    for name, (schema, tokens) in cases.items():
        text = json.dumps(schema)
        t0 = time.perf_counter()
        compiled = compiler.compile_json_schema(text, any_whitespace=False, separators=(", ", ": "))
        compile_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiler.compile_json_schema(text, any_whitespace=False, separators=(", ", ": "))
        cached_s = time.perf_counter() - t0
        mask = xgr.allocate_token_bitmask(1, vocab)
        runs = []
        for _run in range(2):
            matcher = xgr.GrammarMatcher(compiled)
            times = []
            for token in tokens:
                t0 = time.perf_counter()
                matcher.fill_next_token_bitmask(mask, 0)
                times.append(time.perf_counter() - t0)
                assert (int(mask[0, token // 32]) >> (token % 32)) & 1, f"xgrammar forbids {token}"
                assert matcher.accept_token(token)
            runs.append(times)
        out[name] = {
            "tokens": len(tokens),
            "compile_ms": round(compile_s * 1e3, 2),
            "cached_compile_ms": round(cached_s * 1e3, 3),
            "mask_first_request": stats(runs[0]),
            "mask": stats(runs[1]),
        }
    return out


#: Where a random-weight model under `nested_record` spends its steps (the engine's GPU
#: benchmark): inside a plain JSON string, or inside the `format: email` one.
STRING_STATES = {
    "in_plain_string": '{"id": "ABC-1234", "customer": {"name": "',
    "in_email_string": '{"id": "ABC-1234", "customer": {"name": "x", "email": "',
}


def bench_string_states(path: Path, vocab: int, eos: int, batch: int, steps: int = 8) -> dict:
    """A batch's fill with every request inside a string, each advanced by a random
    allowed token per step (both libraries' masks must allow it): the engine's case at
    batch 64, which `bench_llguidance`'s valid outputs do not reach."""
    import random

    import numpy as np
    import torch
    import transformers
    import xgrammar as xgr

    from stator.protocols import GuidedDecoding
    from stator.structured_output.matcher import GrammarCompiler

    schema = SCHEMAS["nested_record"][0]
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))
    compiler = GrammarCompiler(path.read_text(), vocab, [eos])
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[eos])
    compiled = xgr.GrammarCompiler(info).compile_json_schema(
        json.dumps(schema), any_whitespace=False, separators=(", ", ": ")
    )
    xbatch = xgr.BatchGrammarMatcher()
    out: dict = {"batch": batch}
    for state, prefix in STRING_STATES.items():
        rng = random.Random(0)
        ids = hf.encode(prefix, add_special_tokens=False)
        lms = [compiler.matcher(GuidedDecoding(json_schema=schema)) for _ in range(batch)]
        xms = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
        for lm, xm in zip(lms, xms, strict=True):
            for t in ids:
                assert lm.consume_token(t) and xm.accept_token(t)
        lmask = torch.full((batch, compiler.words), -1, dtype=torch.int32)
        xmask = xgr.allocate_token_bitmask(batch, vocab)
        ltimes, xtimes = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            compiler.fill([(m, i) for i, m in enumerate(lms)], lmask.data_ptr(), batch)
            ltimes.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            xbatch.batch_fill_next_token_bitmask(xms, xmask)
            xtimes.append(time.perf_counter() - t0)
            both = (lmask & xmask).numpy().view(np.uint8)
            for i in range(batch):
                allowed = np.nonzero(np.unpackbits(both[i], bitorder="little")[:vocab])[0]
                allowed = allowed[allowed != eos]
                token = int(rng.choice(allowed.tolist())) if len(allowed) else eos
                assert lms[i].consume_token(token) and xms[i].accept_token(token)
        out[state] = {
            "llguidance_fill": stats(ltimes[2:]),
            "xgrammar_fill": stats(xtimes[2:]),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here as JSON")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--string-states",
        action="store_true",
        help="only the batch fill inside JSON strings, llguidance vs xgrammar (128k vocabulary)",
    )
    parser.add_argument(
        "--tokenizer", type=Path, help="--string-states: the 128k tokenizer.json (default: built)"
    )
    args = parser.parse_args()
    if args.string_states:
        path = args.tokenizer or llama3_shaped_tokenizer_json()
        result = bench_string_states(path, 128256, 128001, args.batch)
        print(json.dumps(result, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
        return
    from tokenizers import Tokenizer

    vocabularies = {
        "o200k_harmony (GPT-OSS, 201,088)": (o200k_harmony_tokenizer_json(), 201088, 200002),
        "llama3-shaped 128,256": (llama3_shaped_tokenizer_json(), 128256, 128001),
    }
    results: dict = {}
    for label, (path, vocab, eos) in vocabularies.items():
        tok = Tokenizer.from_file(str(path))
        cases = {
            name: (schema, tok.encode(output_text(value), add_special_tokens=False).ids)
            for name, (schema, value) in SCHEMAS.items()
        }
        entry = {"llguidance": bench_llguidance(path.read_text(), vocab, eos, cases, args.batch)}
        try:
            entry["xgrammar"] = bench_xgrammar(path, vocab, cases)
        except ImportError:
            entry["xgrammar"] = "not installed"
        results[label] = entry
        if args.json:  # after each vocabulary: a cut-short run keeps what it measured
            Path(args.json).write_text(json.dumps(results, indent=2))
        print(label)
        for backend, data in entry.items():
            if not isinstance(data, dict):
                print(f"  {backend}: {data}")
                continue
            for name in SCHEMAS:
                d = data[name]
                extra = d.get(f"batch{args.batch}_fill")
                batch = f", batch {args.batch} fill {extra['mean_us']:.0f} us" if extra else ""
                first = d["mask_first_request"]["mean_us"]
                print(
                    f"  {backend:10s} {name:14s} mask/token mean {d['mask']['mean_us']:7.1f} us "
                    f"p99 {d['mask']['p99_us']:7.1f} us (first request {first:7.1f} us), "
                    f"compile {d['compile_ms']:.1f} ms{batch}"
                )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
