"""Prompt lookup: draft the tokens that followed the last earlier occurrence of the
sequence's current suffix (longest suffix first). No model; free on the host; strong on
outputs that copy from the prompt (code edits, extraction, summaries with quotes)."""

from __future__ import annotations

import numpy as np


def ngram_draft(token_ids: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Up to `k` draft tokens for the sequence `token_ids` (possibly none)."""
    length = len(token_ids)
    if length < min_n + 1 or k <= 0:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        # Windows that start at 0..length-n-1 (the suffix itself excluded).
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # the most recent occurrence
            draft = tokens[start : start + k]
            if draft.size:
                return draft.tolist()
    return []
