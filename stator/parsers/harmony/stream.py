"""Streaming Harmony parsers: over token ids (the primary path) and over text (a fallback for
pipelines that only see detokenized text with the special tokens written out)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from stator.parsers.calls import new_call_id
from stator.parsers.harmony.messages import HarmonyDelta, HarmonyMessageMachine
from stator.parsers.harmony.special_tokens import HARMONY_MARKERS, HarmonyTokenIds
from stator.parsers.jail import find_first, partial_marker_len


class HarmonyStreamParser:
    """Feeds generated token ids; yields reasoning (analysis), content (final and preambles)
    and tool calls (commentary to=functions.x). Content tokens are decoded together until
    they form whole UTF-8 characters, so a character split over tokens is never garbled."""

    def __init__(
        self, tokenizer, token_ids: HarmonyTokenIds | None = None, id_factory=new_call_id
    ) -> None:
        self._tokenizer = tokenizer
        self._ids = token_ids or HarmonyTokenIds.from_tokenizer(tokenizer)
        self._markers = {
            token_id: self._ids.marker_for(token_id)
            for token_id in (
                self._ids.start,
                self._ids.end,
                self._ids.message,
                self._ids.channel,
                self._ids.constrain,
                self._ids.return_,
                self._ids.call,
            )
        }
        self._machine = HarmonyMessageMachine(id_factory)
        self._pending: list[int] = []
        self._emitted = 0  # characters of decode(_pending) already passed on

    @property
    def stop_token_ids(self) -> tuple[int, int]:
        return self._ids.stop_token_ids

    def feed(self, token_ids: Iterable[int]) -> HarmonyDelta:
        out = HarmonyDelta()
        for token_id in token_ids:
            marker = self._markers.get(token_id)
            if marker is None:
                out += self._decode_text(token_id)
                continue
            out += self._flush_pending()
            out += self._machine.marker(marker)
        return out

    def finish(self) -> HarmonyDelta:
        return self._flush_pending() + self._machine.finish()

    def _decode_text(self, token_id: int) -> HarmonyDelta:
        # Tokens whose bytes end mid-character decode to a trailing U+FFFD: hold those
        # characters until the rest arrives, emit the rest now.
        self._pending.append(token_id)
        text = self._tokenizer.decode(self._pending, skip_special_tokens=False)
        whole = text.rstrip("\ufffd")
        delta = self._machine.text(whole[self._emitted :]) if len(whole) > self._emitted else None
        if whole == text:
            self._pending.clear()
            self._emitted = 0
        else:
            self._emitted = len(whole)
        return delta or HarmonyDelta()

    def _flush_pending(self) -> HarmonyDelta:
        if not self._pending:
            return HarmonyDelta()
        text = self._tokenizer.decode(self._pending, skip_special_tokens=False)[self._emitted :]
        self._pending.clear()
        self._emitted = 0
        return self._machine.text(text) if text else HarmonyDelta()


class HarmonyTextParser:
    """The same, over text where the special tokens appear written out (`<|channel|>`)."""

    def __init__(self, id_factory: Callable[[], str] = new_call_id) -> None:
        self._machine = HarmonyMessageMachine(id_factory)
        self._buffer = ""

    def feed(self, text_delta: str) -> HarmonyDelta:
        self._buffer += text_delta
        out = HarmonyDelta()
        while True:
            hit = find_first(self._buffer, HARMONY_MARKERS)
            if hit is None:
                break
            pos, marker = hit
            if pos:
                out += self._machine.text(self._buffer[:pos])
            out += self._machine.marker(marker)
            self._buffer = self._buffer[pos + len(marker) :]
        keep = partial_marker_len(self._buffer, HARMONY_MARKERS)
        if len(self._buffer) > keep:
            out += self._machine.text(self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
        return out

    def finish(self) -> HarmonyDelta:
        out = HarmonyDelta()
        if self._buffer:
            out += self._machine.text(self._buffer)
            self._buffer = ""
        return out + self._machine.finish()
