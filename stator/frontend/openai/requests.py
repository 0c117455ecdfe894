"""OpenAI request bodies, validated by pydantic (the only place pydantic is used).

Range checks that OpenAI documents live here, so a bad value is a 400 naming its
parameter before anything else runs. Fields beyond OpenAI's are the ones vLLM users
expect (top_k, min_p, repetition_penalty, min_tokens, ignore_eos, ...). Unknown fields are
ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic_core import PydanticCustomError

StopField = str | list[str] | None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


# Most choices one completions request may fan out to (prompts × n): 2,000 prompts with
# n=128 made 256,000 choices, 3.5 GB, and blocked the event loop for 39 s.
MAX_CHOICES = 1024
# Keys the chat template call sets itself; `chat_template_kwargs` may not name them.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "tools", "add_generation_prompt", "continue_final_message"}
)
ChatRole = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: ChatRole
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def as_template_dict(self) -> dict[str, Any]:
        """The message as chat templates see it: text content parts joined into one string
        (most templates concatenate `content` as a string); null fields dropped. Raises
        ValueError for content parts other than text (no multimodal input yet)."""
        data = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            kinds = {str(part.get("type")) for part in self.content} - {"text"}
            if kinds:
                raise ValueError(f"content parts of type {sorted(kinds)} are not supported")
            data["content"] = "".join(str(part.get("text", "")) for part in self.content)
        return data


class AgentHints(BaseModel):
    model_config = ConfigDict(extra="ignore")

    priority: int | None = None


class NvExt(BaseModel):
    """Dynamo's `nvext` extension fields that stator reads: latency targets (ms) and a
    priority, which the global router uses to pick a pool."""

    model_config = ConfigDict(extra="ignore")

    ttft_target: Annotated[float, Field(gt=0.0)] | None = None
    itl_target: Annotated[float, Field(gt=0.0)] | None = None
    priority: int | None = None
    agent_hints: AgentHints | None = None


class SamplingFields(BaseModel):
    """Fields shared by chat and completions requests. Strict: `"1"` or `true` is no
    integer (pydantic's lax mode took both)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    # The body as the client sent it (set by the route): vLLM's processor reads its own
    # request model from it, fields this model does not know included.
    _raw: bytes | None = PrivateAttr(default=None)

    model: str
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    min_tokens: Annotated[int, Field(ge=0)] = 0
    n: Annotated[int, Field(ge=1, le=128)] = 1
    seed: int | None = None
    stop: StopField = None
    stop_token_ids: list[int] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: int | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    # vLLM's newer spelling of the guided_* fields: {json|regex|choice|grammar: ...}.
    structured_outputs: dict[str, Any] | None = None
    user: str | None = None
    nvext: NvExt | None = None

    @field_validator("stop")
    @classmethod
    def _stop_strings_not_empty(cls, value: StopField) -> StopField:
        if isinstance(value, list) and any(s == "" for s in value):
            raise ValueError("stop strings must not be empty")
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value is not None and value < -1:
            raise ValueError("top_k must be -1 (disabled) or a positive number")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # Reasoning models: send `reasoning_content` / `reasoning` (false drops them), and
    # GPT-OSS's effort (its Harmony system message).
    include_reasoning: bool = True
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(value or ()))
        if reserved:
            raise ValueError(f"{reserved} are set by the request itself, not by this field")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if value is None or value in ("none", "auto", "required"):
            return value
        if isinstance(value, dict):
            function = value.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if value.get("type") == "function" and isinstance(name, str) and name:
                return value
        raise ValueError(
            "must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}"
        )

    @property
    def completion_limit(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else (self.max_tokens)
        )


PromptField = (
    Annotated[str, Field()]
    | Annotated[list[int], Field(min_length=1)]
    | Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
    | Annotated[list[str], Field(min_length=1)]
)


class CompletionRequest(SamplingFields):
    # Either may be left out, not both (checked with the model's card in hand).
    prompt: PromptField | None = None
    # vLLM's extension: base64 of `torch.save(tensor [tokens, hidden])`, or a list of them.
    prompt_embeds: str | list[str] | None = None
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None

    @property
    def completion_limit(self) -> int | None:
        return self.max_tokens

    @model_validator(mode="after")
    def _choices_bounded(self) -> CompletionRequest:
        prompts = 0
        if isinstance(self.prompt, list) and self.prompt and not isinstance(self.prompt[0], int):
            prompts += len(self.prompt)
        elif self.prompt:
            prompts += 1
        if isinstance(self.prompt_embeds, list):
            prompts += len(self.prompt_embeds)
        elif self.prompt_embeds:
            prompts += 1
        if prompts * self.n > MAX_CHOICES:
            raise PydanticCustomError(
                "too_many_choices",
                f"{prompts} prompts × n={self.n} is more than the {MAX_CHOICES} choices one "
                "request may ask for.",
            )
        return self


class ReasoningOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    effort: Literal["minimal", "low", "medium", "high"] | None = None
    summary: str | None = None


class ResponsesRequest(BaseModel):
    """`POST /v1/responses`. `input` items are checked by `stator.llm.responses`, which
    names the offending item in its error."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    reasoning: ReasoningOptions | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
