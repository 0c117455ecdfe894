"""`ChatTemplate`: render a conversation to a prompt string the way Hugging Face
transformers' `apply_chat_template` does, so a model sees exactly what it was trained on.

Templates come from model repositories, i.e. they are untrusted code: they run in jinja2's
`ImmutableSandboxedEnvironment`, with the globals and filters HF gives them
(`raise_exception`, `strftime_now`, a `tojson` that does not HTML-escape, `dict`,
`namespace`, `loopcontrols`, trim_blocks + lstrip_blocks).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from stator.llm.tokenizer import TokenizerError, load_json, read_model_files, token_content


class TemplateRenderError(ValueError):
    """The conversation cannot be rendered (bad input, or the template refused it)."""


# Names a message's reasoning may arrive under; HF copies it to all of them.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Marks the end of the final message when continuing it; cut off after rendering.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes '<', '>', '&' and '\''; templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationBlock(jinja2.ext.Extension):
    """Accept HF's `{% generation %}...{% endgeneration %}` (it marks assistant tokens for
    training masks); for serving it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


class _SafeNamespace(jinja2.utils.Namespace):
    """`namespace()` that refuses underscore attributes (no route to interpreter internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _SafeNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


class _DictFactory:
    """`dict(...)` and `dict.fromkeys(...)` for templates, without handing them the `dict`
    type itself (whose attributes lead back into the interpreter)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict:
        return dict.fromkeys(*args)


@lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    """Compile once per distinct template text (models of one family share it)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictFactory()
    env.globals["namespace"] = _SafeNamespace
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateError as e:
        raise TemplateRenderError(f"the chat template does not compile: {e}") from e


def _plain(value: Any) -> Any:
    """Rebuild input from plain JSON types only, so a template never sees an object with
    methods the sandbox does not know about (pydantic models become dicts)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _plain(dump())
    return f"<{type(value).__name__}>"


def _prepare_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise TemplateRenderError("messages must be a non-empty list")
    out = []
    for i, message in enumerate(_plain(messages)):
        if not isinstance(message, dict):
            raise TemplateRenderError(f"messages[{i}] must be an object")
        # OpenAI clients send `content: null` / `tool_calls: null`; templates handle a
        # missing key but many render "None" for a null one (HF drops them too).
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if k in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


class ChatTemplate:
    """One model's chat template(s), ready to render conversations."""

    def __init__(
        self,
        source: str | Mapping[str, str],
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
    ) -> None:
        if isinstance(source, str):
            self.templates: dict[str, str] = {"default": source}
        else:
            self.templates = dict(source)
        if not self.templates:
            raise TemplateRenderError("no chat template given")
        for text in self.templates.values():
            compile_template(text)
        # What HF passes to every template: the tokenizer's special tokens by name.
        self.special_tokens: dict[str, str] = dict(special_tokens or {})
        if bos_token is not None:
            self.special_tokens["bos_token"] = bos_token
        if eos_token is not None:
            self.special_tokens["eos_token"] = eos_token

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def from_dir(cls, path: str | Path) -> ChatTemplate | None:
        return cls.from_files(read_model_files(path))

    @classmethod
    def from_files(cls, files: Mapping[str, bytes]) -> ChatTemplate | None:
        """The template of a model's files, or None when the model has none (a base model)."""
        source = find_template_source(files)
        if source is None:
            return None
        config = load_json(files, "tokenizer_config.json")
        special_map = load_json(files, "special_tokens_map.json")
        tokens = {}
        for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token"):
            value = token_content(config.get(key)) or token_content(special_map.get(key))
            if value is not None:
                tokens[key] = value
        return cls(source, special_tokens=tokens)

    # -- rendering -------------------------------------------------------------------------

    def select(self, tools: list | None) -> str:
        """HF's choice among named templates: "tool_use" when tools are given, else
        "default"; a single template is always "default"."""
        if tools is not None and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        if len(self.templates) == 1:
            return next(iter(self.templates.values()))
        names = sorted(self.templates)
        raise TemplateRenderError(f"the model has several chat templates and no default: {names}")

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **template_kwargs: Any,
    ) -> str:
        if continue_final_message and add_generation_prompt:
            raise TemplateRenderError(
                "continue_final_message and add_generation_prompt cannot both be true"
            )
        source = self.select(tools)
        template = compile_template(source)
        chat = _prepare_messages(messages)
        if '"developer"' not in source and "'developer'" not in source:
            chat = developer_as_system(chat)
        if documents is not None and not all(isinstance(d, dict) for d in documents):
            raise TemplateRenderError("documents must be a list of objects")
        if tools is not None and not all(isinstance(t, dict) for t in tools):
            raise TemplateRenderError("tools must be a list of objects")

        final = None
        if continue_final_message:
            final = chat[-1].get("content")
            if not isinstance(final, str):
                raise TemplateRenderError(
                    "continue_final_message needs a final message with string content"
                )
            chat[-1]["content"] = final + _CONTINUE_TAG

        context = {**self.special_tokens, **_plain(template_kwargs)}
        try:
            rendered = template.render(
                messages=chat,
                tools=_plain(tools),
                documents=_plain(documents),
                add_generation_prompt=add_generation_prompt,
                **context,
            )
        except jinja2.exceptions.TemplateError as e:
            # raise_exception(...) lands here: the template's own message is the user's.
            raise TemplateRenderError(str(e) or type(e).__name__) from e
        except Exception as e:
            # Template code is arbitrary: whatever it trips over on this input (a missing
            # key, a division by zero) is a problem with the request, not a server crash.
            raise TemplateRenderError(f"the chat template failed on this input: {e}") from e

        if final is not None:
            rendered = _cut_at_continue_tag(rendered, final)
        return rendered


def developer_as_system(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's `developer` messages for a template that never names that role: each
    becomes a `system` message, and the system messages are then merged into one at the
    front when there are several or one is not first (some templates take a system
    message only there), as vLLM's server does. A template saw no `developer` turn in
    training; rendering one would show the model a role it does not know."""
    if not any(m.get("role") == "developer" for m in chat):
        return chat
    converted = [
        {k: v for k, v in m.items() if k != "tools"} | {"role": "system"}
        if m.get("role") == "developer"
        else m
        for m in chat
    ]
    system: list[str] = []
    rest: list[dict[str, Any]] = []
    merge = False
    for i, message in enumerate(converted):
        if message.get("role") != "system":
            rest.append(message)
            continue
        merge = merge or i > 0 or bool(system)
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "\n".join(
                p["text"] if isinstance(p, dict) else p
                for p in content
                if isinstance(p, str) or (isinstance(p, dict) and "text" in p)
            )
        if content:
            system.append(content)
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(system)}, *rest]


def _cut_at_continue_tag(rendered: str, final: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if tag not in rendered or final.strip() not in rendered:
        raise TemplateRenderError(
            "continue_final_message: the template does not render the final message verbatim"
        )
    at = rendered.rindex(tag)
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    # The template trimmed the message's trailing whitespace, so trim ours too.
    return rendered[:at].rstrip()


def find_template_source(files: Mapping[str, bytes]) -> str | dict[str, str] | None:
    """The chat template in a model's files: `chat_template.jinja` wins (newer HF saves it
    there), then `chat_template.json`, then `tokenizer_config.json`'s `chat_template`
    (a string or a list of `{name, template}`)."""
    if "chat_template.jinja" in files:
        return files["chat_template.jinja"].decode()
    value = load_json(files, "chat_template.json").get("chat_template")
    if value is None:
        value = load_json(files, "tokenizer_config.json").get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {}
        for entry in value:
            if not isinstance(entry, dict) or not isinstance(entry.get("template"), str):
                raise TokenizerError("chat_template list entries need 'name' and 'template'")
            named[str(entry.get("name", "default"))] = entry["template"]
        return named
    raise TokenizerError("chat_template must be a string or a list of named templates")
