"""Tokenizing a chat prompt, the largest single step of the frontend's time to first token:
`tokenizers`' `encode` against `encode_batch_fast` (what `stator.llm.Tokenizer.encode`
uses: the same ids without character offsets) and, for scale, tiktoken on the same
byte-level BPE vocabulary (not used by stator: see benchmarks/README.md, "Frontend,
session 3").

Prompts: ChatML-wrapped random-word user messages of `--tokens` tokens, each different (no
cache hits across prompts), for the tiny test model's byte-level BPE (2,000 tokens).
Prints per variant the median and best of `--rounds` rounds: wall and CPU time per prompt.

    flock /work/bench.lock python benchmarks/frontend_tokenize.py --tokens 512 --prompts 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# GPT-2's pre-tokenizer pattern, which `ByteLevel(use_regex=True)` applies.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def tiktoken_encoder(tokenizer) -> Callable[[str], list[int]] | None:
    """tiktoken over the same vocabulary (ranks = ids), special tokens split out as
    `tokenizers` does; None when tiktoken is not installed."""
    try:
        import tiktoken
    except ImportError:
        return None
    from stator.llm.token_bytes import byte_level_table

    table = byte_level_table(tokenizer)
    special = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}
    ranks = {raw: i for i, raw in enumerate(table) if raw is not None and i not in special.values()}
    enc = tiktoken.Encoding("bench", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens=special)  # fmt: skip
    return lambda text: enc.encode(text, allowed_special="all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    sys.path.insert(0, str(REPO / "benchmarks"))
    from mocker_fidelity import Prompts
    from tokenizers import Tokenizer

    from tests.model_factory import make_model_dir

    model_dir = make_model_dir(Path(tempfile.mkdtemp()) / "tiny")
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    words = Prompts(tok, seed=11)
    texts = [
        f"<|im_start|>user\n{words.text(args.tokens - 10)}<|im_end|>\n<|im_start|>assistant\n"
        for _ in range(args.prompts)
    ]
    variants: dict[str, Callable[[str], list[int]]] = {
        "tokenizers encode": lambda t: tok.encode(t, add_special_tokens=False).ids,
        "tokenizers encode_batch_fast": lambda t: (
            tok.encode_batch_fast([t], add_special_tokens=False)[0].ids
        ),
    }
    fast_tiktoken = tiktoken_encoder(tok)
    if fast_tiktoken is not None:
        variants["tiktoken (same vocabulary)"] = fast_tiktoken
    reference = [variants["tokenizers encode"](t) for t in texts]
    mean_tokens = statistics.mean(len(ids) for ids in reference)
    print(f"{args.prompts} prompts, {mean_tokens:.0f} tokens each on average")
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):  # variants interleaved, so drift hits all alike
        for name, encode in variants.items():
            w0, c0 = time.perf_counter(), time.process_time()
            for text in texts:
                encode(text)
            wall[name].append((time.perf_counter() - w0) / len(texts) * 1e3)
            cpu[name].append((time.process_time() - c0) / len(texts) * 1e3)
    print("| variant | wall ms/prompt, median (best) | CPU ms/prompt, median | same ids |")
    print("|---|---|---|---|")
    for name, encode in variants.items():
        same = sum(encode(t) == ids for t, ids in zip(texts, reference, strict=True))
        print(f"| {name} | {statistics.median(wall[name]):.3f} ({min(wall[name]):.3f}) | "
              f"{statistics.median(cpu[name]):.3f} | {same}/{len(texts)} |")  # fmt: skip


if __name__ == "__main__":
    main()
