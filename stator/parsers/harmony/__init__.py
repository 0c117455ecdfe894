"""GPT-OSS's Harmony format: rendering prompts and parsing output, on the model's own tokenizer."""

from stator.parsers.harmony.chat import ChatConversionError, chat_to_harmony
from stator.parsers.harmony.messages import HarmonyDelta, HarmonyHeader, parse_header
from stator.parsers.harmony.render import (
    DeveloperContent,
    HarmonyMessage,
    HarmonyRenderer,
    SystemContent,
    drop_analysis_of_finished_turns,
)
from stator.parsers.harmony.special_tokens import HarmonyTokenIds, HarmonyVocabularyError
from stator.parsers.harmony.stream import HarmonyStreamParser, HarmonyTextParser

__all__ = [
    "ChatConversionError",
    "DeveloperContent",
    "HarmonyDelta",
    "HarmonyHeader",
    "HarmonyMessage",
    "HarmonyRenderer",
    "HarmonyStreamParser",
    "HarmonyTextParser",
    "HarmonyTokenIds",
    "HarmonyVocabularyError",
    "SystemContent",
    "chat_to_harmony",
    "drop_analysis_of_finished_turns",
    "parse_header",
]
