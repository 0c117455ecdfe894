"""The Harmony special tokens, looked up in the model's own tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

START = "<|start|>"
END = "<|end|>"
MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
CONSTRAIN = "<|constrain|>"
RETURN = "<|return|>"
CALL = "<|call|>"

HARMONY_MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)


class HarmonyVocabularyError(RuntimeError):
    """The tokenizer cannot speak Harmony; raised at load time, never mid-request."""


@dataclass(frozen=True)
class HarmonyTokenIds:
    start: int
    end: int
    message: int
    channel: int
    constrain: int
    return_: int
    call: int

    @classmethod
    def from_tokenizer(cls, tokenizer) -> HarmonyTokenIds:
        """`tokenizer` is a `tokenizers.Tokenizer` (the model's tokenizer.json)."""
        ids = {marker: tokenizer.token_to_id(marker) for marker in HARMONY_MARKERS}
        missing = [marker for marker, token_id in ids.items() if token_id is None]
        if missing:
            raise HarmonyVocabularyError(
                f"the tokenizer lacks the Harmony special tokens {', '.join(missing)}; "
                "GPT-OSS needs its own tokenizer.json (o200k_harmony)"
            )
        return cls(
            start=ids[START],
            end=ids[END],
            message=ids[MESSAGE],
            channel=ids[CHANNEL],
            constrain=ids[CONSTRAIN],
            return_=ids[RETURN],
            call=ids[CALL],
        )

    @property
    def stop_token_ids(self) -> tuple[int, int]:
        """`<|return|>` (answer done) and `<|call|>` (waiting for a tool): end generation."""
        return (self.return_, self.call)

    def marker_for(self, token_id: int) -> str | None:
        return _MARKER_BY_FIELD.get(self._field_by_id().get(token_id, ""))

    def _field_by_id(self) -> dict[int, str]:
        return {getattr(self, name): name for name in _MARKER_BY_FIELD}


_MARKER_BY_FIELD = {
    "start": START,
    "end": END,
    "message": MESSAGE,
    "channel": CHANNEL,
    "constrain": CONSTRAIN,
    "return_": RETURN,
    "call": CALL,
}
