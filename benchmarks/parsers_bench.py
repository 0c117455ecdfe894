"""Throughput of the output parsers, fed the way the frontend feeds them (one token's text,
or one token id, at a time). Prints one line per case.

    python benchmarks/parsers_bench.py [--gpt-oss-tokenizer PATH/tokenizer.json]

Without a GPT-OSS tokenizer.json, the Harmony token-level cases are skipped (the test suite
builds one offline: tests/parsers/harmony_vocab.py).
"""

from __future__ import annotations

import argparse
import json
import time

from stator.parsers import OutputParser
from stator.parsers.harmony import (
    HarmonyMessage,
    HarmonyRenderer,
    HarmonyStreamParser,
    SystemContent,
)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "and",
    "keeps",
    "on",
    "running",
    "",
]


def prose(n_words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n_words))


def chunks_of(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def time_text_case(name: str, names: tuple, text: str, repeat: int = 5) -> None:
    pieces = chunks_of(text)
    best = float("inf")
    for _ in range(repeat):
        parser = OutputParser(*names, tools=TOOLS)
        start = time.perf_counter()
        for piece in pieces:
            parser.feed(piece)
        parser.finish()
        best = min(best, time.perf_counter() - start)
    print(
        f"{name:<34} {len(pieces):>6} chunks  {best * 1e3:8.2f} ms  "
        f"{len(pieces) / best / 1e3:8.1f} k chunks/s  {best / len(pieces) * 1e6:6.2f} us/chunk"
    )


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--gpt-oss-tokenizer", default=None)
    options = args.parse_args()

    body = prose(4000)
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    time_text_case("plain content (no parsers)", (None, None), body)
    time_text_case(
        "deepseek_r1 reasoning+content", ("deepseek_r1", None), f"<think>{body}</think>{body}"
    )
    time_text_case(
        "qwen3 + hermes (content, 1 call)", ("qwen3", "hermes"), f"{body}</think>{body}{call}"
    )
    long_call = json.dumps({"name": "get_weather", "arguments": {"text": body}})
    time_text_case(
        "hermes, one 4k-word call", (None, "hermes"), f"<tool_call>{long_call}</tool_call>"
    )
    harmony_text = (
        f"<|channel|>analysis<|message|>{body}<|end|><|start|>assistant<|channel|>final"
        f"<|message|>{body}<|return|>"
    )
    time_text_case("gpt_oss text-level", ("gpt_oss", "harmony"), harmony_text)

    if options.gpt_oss_tokenizer:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(options.gpt_oss_tokenizer)
        ids = tokenizer.encode(harmony_text, add_special_tokens=False).ids
        best = float("inf")
        for _ in range(5):
            parser = HarmonyStreamParser(tokenizer)
            start = time.perf_counter()
            for token in ids:
                parser.feed([token])
            parser.finish()
            best = min(best, time.perf_counter() - start)
        print(
            f"{'harmony token-level, 1 id/feed':<34} {len(ids):>6} tokens  {best * 1e3:8.2f} ms  "
            f"{len(ids) / best / 1e3:8.1f} k tok/s    {best / len(ids) * 1e6:6.2f} us/token"
        )
        start = time.perf_counter()
        renderer = HarmonyRenderer(tokenizer)
        setup = time.perf_counter() - start
        messages = [HarmonyMessage("system", SystemContent())] + [
            HarmonyMessage(role, prose(300), channel="final" if role == "assistant" else None)
            for role in ["user", "assistant"] * 10
        ]
        start = time.perf_counter()
        prompt = renderer.render_for_completion(messages)
        render = time.perf_counter() - start
        print(
            f"{'harmony render 20 turns':<34} {len(prompt):>6} tokens  {render * 1e3:8.2f} ms  "
            f"(renderer setup {setup * 1e3:.0f} ms, once per model)"
        )


if __name__ == "__main__":
    main()
