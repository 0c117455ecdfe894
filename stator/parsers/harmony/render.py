"""Rendering a conversation into Harmony token ids with the model's own tokenizer.

Each message is `<|start|>{author}[ to={recipient}]<|channel|>{channel}[ {content_type}]
<|message|>{content}<|end|>`, where an assistant message to a recipient (a tool call) ends in
`<|call|>`; a tool result's recipient follows its channel (`<|channel|>commentary
to=assistant`), as vLLM renders it (openai-harmony 0.0.8 and the model's chat template put
it before the channel; vLLM is our reference for prompt ids). Text pieces are encoded on their own with special-token matching off, so a user
who types `<|end|>` gets those characters, not the control token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from stator.parsers.harmony.special_tokens import CONSTRAIN, HarmonyTokenIds
from stator.parsers.harmony.typescript import tools_namespace

DEFAULT_MODEL_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
DEFAULT_KNOWLEDGE_CUTOFF = "2024-06"
REASONING_EFFORTS = ("low", "medium", "high")


@dataclass
class SystemContent:
    model_identity: str | None = DEFAULT_MODEL_IDENTITY
    knowledge_cutoff: str | None = DEFAULT_KNOWLEDGE_CUTOFF
    current_date: str | None = None
    reasoning_effort: str | None = "medium"
    valid_channels: tuple[str, ...] = ("analysis", "commentary", "final")
    channel_required: bool = True

    def render_text(self, has_function_tools: bool) -> str:
        top = [self.model_identity] if self.model_identity else []
        if self.knowledge_cutoff:
            top.append(f"Knowledge cutoff: {self.knowledge_cutoff}")
        if self.current_date:
            top.append(f"Current date: {self.current_date}")
        sections = ["\n".join(top)] if top else []
        if self.reasoning_effort:
            if self.reasoning_effort not in REASONING_EFFORTS:
                raise ValueError(f"reasoning effort must be one of {REASONING_EFFORTS}")
            sections.append(f"Reasoning: {self.reasoning_effort}")
        if self.valid_channels:
            header = f"# Valid channels: {', '.join(self.valid_channels)}."
            if self.channel_required:
                header += " Channel must be included for every message."
            if has_function_tools:
                header += "\nCalls to these tools must go to the commentary channel: 'functions'."
            sections.append(header)
        return "\n\n".join(sections)


@dataclass
class DeveloperContent:
    instructions: str | None = None
    # OpenAI-style function definitions: {name, description, parameters}.
    function_tools: list[dict] = field(default_factory=list)

    def render_text(self) -> str:
        sections = ["# Instructions", self.instructions] if self.instructions else []
        if self.function_tools:
            sections.append("# Tools\n\n" + tools_namespace("functions", self.function_tools))
        return "\n\n".join(sections)


@dataclass
class HarmonyMessage:
    """`author` is the role, or for a tool result the tool's name (`functions.get_weather`)."""

    author: str
    # A list is text parts, each encoded on its own (as vLLM does with a message's parts).
    content: str | list[str] | SystemContent | DeveloperContent
    channel: str | None = None
    recipient: str | None = None
    # e.g. "<|constrain|>json" (or "json"): the arguments' format of a tool call.
    content_type: str | None = None


class HarmonyRenderer:
    def __init__(self, tokenizer, token_ids: HarmonyTokenIds | None = None) -> None:
        """`tokenizer`: a `tokenizers.Tokenizer` built from the model's tokenizer.json."""
        self._ids = token_ids or HarmonyTokenIds.from_tokenizer(tokenizer)
        self._tokenizer = tokenizer
        added = sorted(t.content for t in tokenizer.get_added_tokens_decoder().values())
        self._added_pattern = re.compile("|".join(re.escape(t) for t in added if t))
        self._literal_tokenizer = None

    @property
    def token_ids(self) -> HarmonyTokenIds:
        return self._ids

    def render_for_completion(
        self, messages: list[HarmonyMessage], *, drop_finished_analysis: bool = True
    ) -> list[int]:
        """The prompt: the conversation, then `<|start|>assistant` for the model to continue."""
        prompt = self.render_conversation(messages, drop_finished_analysis=drop_finished_analysis)
        return [*prompt, self._ids.start, *self._text("assistant")]

    def render_conversation(
        self, messages: list[HarmonyMessage], *, drop_finished_analysis: bool = True
    ) -> list[int]:
        has_tools = any(
            isinstance(m.content, DeveloperContent) and m.content.function_tools for m in messages
        )
        if drop_finished_analysis:
            messages = drop_analysis_of_finished_turns(messages)
        tokens: list[int] = []
        for message in messages:
            tokens += self.render_message(message, has_function_tools=has_tools)
        return tokens

    def render_message(
        self, message: HarmonyMessage, *, has_function_tools: bool = False
    ) -> list[int]:
        ids = self._ids
        tokens = [ids.start, *self._text(message.author)]
        recipient = message.recipient if message.recipient != "all" else None
        # As vLLM 0.32 renders them (oss-harmony 0.0.11 plus vLLM's own fix-up): an
        # assistant's recipient before the channel, anyone else's (a tool result's) after.
        to_after_channel = message.author != "assistant"
        if recipient and not to_after_channel:
            tokens += self._text(f" to={recipient}")
        if message.channel:
            tokens += [ids.channel, *self._text(message.channel)]
        if recipient and to_after_channel:
            tokens += self._text(f" to={recipient}")
        if message.content_type:
            content_type = message.content_type
            if content_type.startswith(CONSTRAIN):
                tokens += [
                    *self._text(" "),
                    ids.constrain,
                    *self._text(content_type[len(CONSTRAIN) :]),
                ]
            else:
                tokens += self._text(f" {content_type}")
        tokens.append(ids.message)
        content = message.content
        if isinstance(content, SystemContent):
            tokens += self._text(content.render_text(has_function_tools))
        elif isinstance(content, DeveloperContent):
            tokens += self._text(content.render_text())
        elif isinstance(content, list):
            for part in content:
                tokens += self._text(part)
        else:
            tokens += self._text(content)
        is_call = message.author == "assistant" and message.recipient is not None
        tokens.append(ids.call if is_call else ids.end)
        return tokens

    def _text(self, text: str) -> list[int]:
        if not text:
            return []
        tokenizer = self._tokenizer
        if self._added_pattern.search(text):
            tokenizer = self._literal()
        return tokenizer.encode(text, add_special_tokens=False).ids

    def _literal(self):
        """A copy of the tokenizer that reads special-token text as plain text. Built only
        when a message contains such text (the copy takes seconds for a 200k vocabulary), and
        a copy because the setting is per object and the shared one must keep specials."""
        if self._literal_tokenizer is None:
            from tokenizers import Tokenizer

            self._literal_tokenizer = Tokenizer.from_str(self._tokenizer.to_str())
            self._literal_tokenizer.encode_special_tokens = True
        return self._literal_tokenizer


def drop_analysis_of_finished_turns(messages: list[HarmonyMessage]) -> list[HarmonyMessage]:
    """Analysis before the last `final` answer belongs to finished turns: the model never sees
    it again. Analysis after it (the current turn, e.g. across tool calls) is kept."""
    last_final = max(
        (i for i, m in enumerate(messages) if m.author == "assistant" and m.channel == "final"),
        default=-1,
    )
    return [
        m
        for i, m in enumerate(messages)
        if not (i < last_final and m.author == "assistant" and m.channel == "analysis")
    ]
