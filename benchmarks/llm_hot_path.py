"""Micro-benchmark of the frontend's per-request CPU work in `stator.llm`:

- detokenize + stop-string check, µs per generated token (one token per engine output, the
  streaming worst case), through `ChoiceProcessor` and through its parts;
- chat template + tokenize of a ~512-token chat prompt, ms per request.

Tokenizers are trained on the fly (nothing can be downloaded): the tests' 2k-vocab
byte-level BPE, a 32k-vocab one closer to real models (both take the byte-table fast
path), and a SentencePiece-style byte-fallback one (the windowed decode path).

    python benchmarks/llm_hot_path.py [--tokens 20000] [--repeat 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stator.llm import (
    ChatTemplate,
    ChoiceProcessor,
    IncrementalDetokenizer,
    StopStringMatcher,
    Tokenizer,
)
from stator.protocols import EngineOutput
from tests.llm.sentencepiece_style import make_byte_fallback_dir
from tests.model_factory import CHATML_TEMPLATE, make_model_dir, train_tokenizer, training_text

GENERATED = (
    "Here is the plan. First, read the file and parse each line; then build the index.\n"
    "def build(lines):\n    return {k: v for k, v in (l.split('=') for l in lines)}\n"
    "日本語のテキストも少し混ぜます。中文也一样。 Emoji too 🎉👍 and accents: café, naïve.\n"
)
SYSTEM = "You are a careful assistant. Answer concisely and cite the code you refer to."


def big_tokenizer(path: Path, vocab_size: int) -> Path:
    """A model dir like the tests' one, with a larger byte-level BPE vocabulary."""
    make_model_dir(path)
    tok = train_tokenizer(vocab_size, training_text(3_000_000))
    (path / "tokenizer.json").write_text(tok.to_str())
    return path


def chat_prompt(tok: Tokenizer, template: ChatTemplate, target: int) -> list[dict]:
    """A multi-turn conversation whose rendered prompt is about `target` tokens."""
    messages = [{"role": "system", "content": SYSTEM}]
    turn = 0
    while len(tok.encode(template.render(messages))) < target:
        role = "user" if turn % 2 == 0 else "assistant"
        messages.append({"role": role, "content": GENERATED[: 120 + 40 * (turn % 3)]})
        turn += 1
    return messages


def per_token_us(fn, ids: list[int], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn(ids)
        best = min(best, time.perf_counter() - started)
    return best / len(ids) * 1e6


def bench(name: str, path: Path, n_tokens: int, repeat: int) -> None:
    tok = Tokenizer.from_dir(path)
    template = ChatTemplate.from_dir(path)
    ids = (tok.encode(GENERATED) * (n_tokens // len(tok.encode(GENERATED)) + 1))[:n_tokens]
    stops = ["Observation:", "</answer>"]
    outputs = [EngineOutput(token_ids=[i]) for i in ids]

    def processor(_ids):
        p = ChoiceProcessor(tok, stops, prompt_token_ids=ids[:512])
        for out in outputs:
            p.process(out)

    def processor_no_stops(_ids):
        p = ChoiceProcessor(tok, prompt_token_ids=ids[:512])
        for out in outputs:
            p.process(out)

    def detok_only(ids):
        d = IncrementalDetokenizer(tok)
        for i in ids:
            d.add((i,))

    pieces = [tok.decode([i]) for i in ids]

    def stops_only(_ids):
        m = StopStringMatcher(stops)
        for piece in pieces:
            m.feed(piece)

    print(f"\n[{name}] vocab={tok.vocab_size}, {len(ids)} generated tokens, 1 token per output")
    print(f"  ChoiceProcessor, 2 stop strings : {per_token_us(processor, ids):6.2f} µs/token")
    print(
        f"  ChoiceProcessor, no stop strings: {per_token_us(processor_no_stops, ids):6.2f} µs/token"
    )
    print(f"  IncrementalDetokenizer alone    : {per_token_us(detok_only, ids):6.2f} µs/token")
    print(f"  StopStringMatcher alone         : {per_token_us(stops_only, ids):6.2f} µs/token")

    messages = chat_prompt(tok, template, 512)
    n_prompt = len(tok.encode(template.render(messages)))
    times = {"template": [], "tokenize": [], "both": []}
    for _ in range(repeat):
        t0 = time.perf_counter()
        text = template.render(messages, add_generation_prompt=True)
        t1 = time.perf_counter()
        tok.encode(text)
        t2 = time.perf_counter()
        times["template"].append(t1 - t0)
        times["tokenize"].append(t2 - t1)
        times["both"].append(t2 - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(
        f"  chat prompt of {n_prompt} tokens ({len(messages)} messages): template "
        f"{med['template']:.3f} ms + tokenize {med['tokenize']:.3f} ms = {med['both']:.3f} ms "
        f"(median of {repeat})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        small = make_model_dir(Path(tmp) / "small")
        bench("test tokenizer", small, args.tokens, args.repeat)
        large = big_tokenizer(Path(tmp) / "large", 32000)
        bench("32k byte-level BPE", large, args.tokens, args.repeat)
        # SentencePiece style (byte fallback): the windowed decode path.
        spm = make_byte_fallback_dir(Path(tmp) / "spm")
        (spm / "tokenizer_config.json").write_text(
            json.dumps({"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHATML_TEMPLATE})
        )
        bench("1.5k SentencePiece-style BPE, byte fallback", spm, args.tokens, args.repeat)


if __name__ == "__main__":
    main()
