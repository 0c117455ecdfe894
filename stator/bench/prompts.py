"""Deterministic prompt text of a requested token length.

Prompts are sequences of words drawn with a seeded RNG, so the same (seed, key) gives the
same text on every run and against every server, and different keys give different text
(no accidental prefix-cache hits). With a tokenizer, each word's token count (with its
leading space) is measured once, and words are chosen so the prompt has exactly the
requested number of tokens for byte-level BPE tokenizers (where " a b" encodes as " a" +
" b"); without one, a word counts as one token (approximate; the server's usage reports
the real count).
"""

from __future__ import annotations

import bisect
import itertools
import random
from pathlib import Path

# Common English nouns: prompts need varied words, not meaning.
_WORDS = (
    "action",
    "activity",
    "age",
    "air",
    "area",
    "arm",
    "art",
    "attention",
    "baby",
    "back",
    "body",
    "book",
    "boy",
    "bread",
    "building",
    "business",
    "car",
    "care",
    "case",
    "center",
    "change",
    "child",
    "city",
    "class",
    "cloud",
    "college",
    "community",
    "company",
    "computer",
    "control",
    "cost",
    "country",
    "couple",
    "court",
    "data",
    "day",
    "death",
    "decision",
    "development",
    "difference",
    "director",
    "doctor",
    "door",
    "drug",
    "education",
    "effect",
    "effort",
    "end",
    "event",
    "evidence",
    "experience",
    "eye",
    "face",
    "fact",
    "family",
    "father",
    "field",
    "figure",
    "film",
    "foot",
    "force",
    "form",
    "friend",
    "game",
    "garden",
    "girl",
    "government",
    "ground",
    "group",
    "guy",
    "hair",
    "hand",
    "head",
    "health",
    "heart",
    "history",
    "home",
    "hour",
    "house",
    "idea",
    "image",
    "industry",
    "information",
    "interest",
    "issue",
    "job",
    "kid",
    "kind",
    "land",
    "law",
    "leader",
    "level",
    "life",
    "light",
    "line",
    "lot",
    "love",
    "man",
    "market",
    "matter",
    "member",
    "mind",
    "minute",
    "model",
    "moment",
    "money",
    "month",
    "morning",
    "mother",
    "movie",
    "music",
    "name",
    "nation",
    "need",
    "news",
    "night",
    "north",
    "number",
    "office",
    "official",
    "oil",
    "organization",
    "others",
    "paper",
    "parent",
    "part",
    "party",
    "patient",
    "people",
    "person",
    "phone",
    "picture",
    "piece",
    "place",
    "plan",
    "player",
    "point",
    "police",
    "policy",
    "population",
    "position",
    "power",
    "practice",
    "president",
    "price",
    "problem",
    "product",
    "program",
    "project",
    "question",
    "rate",
    "reason",
    "record",
    "relationship",
    "report",
    "research",
    "result",
    "right",
    "river",
    "road",
    "role",
    "room",
    "school",
    "season",
    "sense",
    "service",
    "show",
    "side",
    "site",
    "situation",
    "society",
    "son",
    "source",
    "space",
    "star",
    "state",
    "step",
    "stone",
    "story",
    "street",
    "student",
    "study",
    "summer",
    "support",
    "system",
    "table",
    "tax",
    "teacher",
    "team",
    "technology",
    "test",
    "thing",
    "time",
    "town",
    "tree",
    "type",
    "value",
    "view",
    "voice",
    "wall",
    "war",
    "water",
    "way",
    "week",
    "wife",
    "window",
    "woman",
    "word",
    "work",
    "worker",
    "world",
    "year",
)


def _base_words() -> list[str]:
    return list(_WORDS)


class PromptSource:
    def __init__(self, seed: int = 0, tokenizer_dir: str | None = None) -> None:
        self.seed = seed
        words = _base_words()
        if tokenizer_dir:
            from tokenizers import Tokenizer

            path = Path(tokenizer_dir)
            tok = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
            lengths = {w: len(tok.encode(" " + w, add_special_tokens=False).ids) for w in words}
        else:
            lengths = dict.fromkeys(words, 1)
        self.words = [w for w in words if lengths[w] >= 1]
        self.lengths = lengths
        # One-token words let us hit an exact total.
        self.fillers = [w for w in self.words if lengths[w] == 1] or self.words[:1]

    def text(self, num_tokens: int, key: object) -> str:
        """About `num_tokens` tokens of text, a pure function of (seed, key)."""
        if num_tokens <= 0:
            return ""
        rng = random.Random(f"{self.seed}:{key}")
        # One draw for the bulk (every word is at least one token, so `num_tokens` words
        # always suffice), cut where the running token count would pass the target; then
        # one-token words fill the rest. Per-word draws cost ~1.7 ms per 512-token prompt.
        picks = rng.choices(self.words, k=num_tokens)
        lengths = self.lengths
        running = list(itertools.accumulate(lengths[w] for w in picks))
        cut = bisect.bisect_right(running, num_tokens)
        words = picks[:cut]
        remaining = num_tokens - (running[cut - 1] if cut else 0)
        if remaining > 0:
            words += rng.choices(self.fillers, k=remaining)
        return " " + " ".join(words)

    def blocks(self, hash_ids: list[int], block_tokens: int, total_tokens: int) -> str:
        """A prompt built from shared blocks: equal hash ids give equal text, so prefix
        reuse in a trace is real; the last block is cut to reach `total_tokens`."""
        parts = []
        remaining = total_tokens
        for hid in hash_ids:
            if remaining <= 0:
                break
            n = min(block_tokens, remaining)
            parts.append(self.text(n, f"block:{hid}:{n}"))
            remaining -= n
        if remaining > 0:
            parts.append(self.text(remaining, f"tail:{hash_ids[-1] if hash_ids else 0}"))
        return "".join(parts)
