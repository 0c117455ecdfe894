"""`IncrementalDetokenizer`: token ids in, new text out, as a stream.

Decoding each token alone is wrong (a character may span tokens; SentencePiece decoders
treat the first token of a string specially), and decoding the whole sequence each time is
O(n²). So we keep two offsets into the ids (the prefix-offset / read-offset technique of
Hugging Face TGI and vLLM):

    ids:   ...  [prefix_offset ........ read_offset ........ end]
                 \\___ already emitted ___/\\___ pending ___/

and decode only the short window from `prefix_offset`: the text the window adds beyond what
its already-emitted part decodes to is the new text. Text ending in U+FFFD is held back: its
last character is an incomplete UTF-8 sequence that the next token will finish.

With `skip_special_tokens`, special ids are dropped on arrival rather than at decode time.
That is exactly what decoding the whole sequence does (tokenizers filters them before the
decoder chain), so a window never starts on an invisible token, and "Hi</s> there" streams as
"Hi" + " there", as the whole-sequence decode gives, not "Hi" + "there".
"""

from __future__ import annotations

from collections.abc import Iterable

from stator.llm.tokenizer import Tokenizer

# Prompt tokens kept as decoding context, so the first generated token decodes as it does
# in the middle of text (a SentencePiece "▁Hello" keeps its space after the prompt).
PROMPT_CONTEXT_TOKENS = 5
# Ids before the prefix offset are dead; drop them once this many pile up (keeps slicing
# cheap without paying a list shift on every call).
_COMPACT_AT = 256
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    __slots__ = ("_chunks", "_decode", "_ids", "_prefix", "_prefix_text", "_read", "_special")

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Iterable[int] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self._decode = tokenizer.inner.decode
        self._special: frozenset[int] = (
            frozenset(tokenizer.special_ids) if skip_special_tokens else frozenset()
        )
        context: list[int] = []
        if prompt_ids is not None:
            # Walk back from the end of the prompt: only the last few visible tokens matter.
            for token_id in reversed(list(prompt_ids)):
                if token_id not in self._special:
                    context.append(token_id)
                    if len(context) == PROMPT_CONTEXT_TOKENS:
                        break
            context.reverse()
        self._ids: list[int] = context
        self._prefix = 0
        self._read = len(context)
        self._prefix_text = self._decode(context, skip_special_tokens=False) if context else ""
        self._chunks: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    def add(self, token_ids: Iterable[int]) -> str:
        """Append generated ids; return the text they complete (possibly "")."""
        special = self._special
        new = [t for t in token_ids if t not in special] if special else list(token_ids)
        if not new:
            return ""
        ids = self._ids
        ids.extend(new)
        window = self._decode(ids[self._prefix :], skip_special_tokens=False)
        if len(window) <= len(self._prefix_text) or window.endswith(_REPLACEMENT):
            return ""
        return self._advance(window)

    def flush(self) -> str:
        """At the end of the stream: whatever is still held back (an incomplete character
        decodes as U+FFFD, as the whole-sequence decode shows it)."""
        if self._read == len(self._ids):
            return ""
        window = self._decode(self._ids[self._prefix :], skip_special_tokens=False)
        if len(window) <= len(self._prefix_text):
            self._read = len(self._ids)
            return ""
        return self._advance(window)

    def _advance(self, window: str) -> str:
        delta = window[len(self._prefix_text) :]
        ids = self._ids
        self._prefix = self._read
        self._read = len(ids)
        if self._prefix >= _COMPACT_AT:
            del ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
        self._prefix_text = self._decode(ids[self._prefix : self._read], skip_special_tokens=False)
        self._chunks.append(delta)
        return delta
