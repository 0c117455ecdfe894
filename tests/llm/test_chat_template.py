"""Our chat-template rendering and tokenization against transformers' apply_chat_template."""

from __future__ import annotations

import json

import pytest

from stator.llm.chat_template import ChatTemplate, TemplateRenderError
from stator.llm.tokenizer import Tokenizer
from tests.llm.templates import ALTERNATING, LLAMA3_TOOLS, SYSTEM_DEFAULT
from tests.model_factory import CHATML_TEMPLATE, make_model_dir

transformers = pytest.importorskip("transformers")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <now> & later",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "Città"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hello there!"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2? 你好 🎉"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
]

TOOL_CONVERSATION = [
    {"role": "system", "content": "You call tools."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call_1"},
]


@pytest.fixture(scope="module", params=["chatml", "llama3", "system_default", "alternating"])
def model(request, tmp_path_factory):
    template = {
        "chatml": CHATML_TEMPLATE,
        "llama3": LLAMA3_TOOLS,
        "system_default": SYSTEM_DEFAULT,
        "alternating": ALTERNATING,
    }[request.param]
    path = make_model_dir(tmp_path_factory.mktemp(request.param), chat_template=template)
    hf = transformers.AutoTokenizer.from_pretrained(str(path))
    return request.param, path, hf


def hf_ids(hf, messages, **kwargs) -> list[int]:
    out = hf.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(out["input_ids"]) if hasattr(out, "keys") else list(out)


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_and_ids_match_transformers(model, conversation, add_generation_prompt):
    _, path, hf = model
    ours = ChatTemplate.from_dir(path)
    tok = Tokenizer.from_dir(path)
    text = ours.render(conversation, add_generation_prompt=add_generation_prompt)
    expected = hf.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert text == expected
    assert tok.encode(text) == hf_ids(hf, conversation, add_generation_prompt=add_generation_prompt)


def test_tools_render_like_transformers(tmp_path):
    path = make_model_dir(tmp_path, chat_template=LLAMA3_TOOLS)
    hf = transformers.AutoTokenizer.from_pretrained(str(path))
    ours = ChatTemplate.from_dir(path)
    tok = Tokenizer.from_dir(path)
    for messages in (CONVERSATIONS[1], TOOL_CONVERSATION):
        text = ours.render(messages, tools=TOOLS, add_generation_prompt=True)
        expected = hf.apply_chat_template(
            messages, tools=TOOLS, tokenize=False, add_generation_prompt=True
        )
        assert text == expected
        # tojson must not HTML-escape and must keep non-ASCII as is.
        assert "Weather <now> & later" in text and "Città" in text
        assert tok.encode(text) == hf_ids(hf, messages, tools=TOOLS, add_generation_prompt=True)
    # Template kwargs reach the template (and override its default).
    text = ours.render(CONVERSATIONS[0], date_string="01 Jan 2030")
    assert "Today Date: 01 Jan 2030" in text


def test_raise_exception_becomes_render_error(tmp_path):
    path = make_model_dir(tmp_path, chat_template=ALTERNATING)
    ours = ChatTemplate.from_dir(path)
    bad = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(TemplateRenderError, match="roles must alternate"):
        ours.render(bad)
    hf = transformers.AutoTokenizer.from_pretrained(str(path))
    with pytest.raises(Exception, match="roles must alternate"):
        hf.apply_chat_template(bad, tokenize=False)


def test_continue_final_message_matches_transformers(tiny_model_dir):
    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))
    ours = ChatTemplate.from_dir(tiny_model_dir)
    messages = [
        {"role": "user", "content": "Write a haiku"},
        {"role": "assistant", "content": "Autumn moonlight -"},
    ]
    text = ours.render(messages, add_generation_prompt=False, continue_final_message=True)
    assert text == hf.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert text.endswith("Autumn moonlight -")
    with pytest.raises(TemplateRenderError):
        ours.render(messages, add_generation_prompt=True, continue_final_message=True)


def test_named_templates_pick_tool_use_when_tools_given(tmp_path):
    path = make_model_dir(tmp_path, chat_template=None)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "default", "template": "DEFAULT{{ messages[0].content }}"},
        {"name": "tool_use", "template": "TOOLS{{ tools | length }}"},
    ]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    ours = ChatTemplate.from_dir(path)
    assert ours.render([{"role": "user", "content": "x"}]) == "DEFAULTx"
    assert ours.render([{"role": "user", "content": "x"}], tools=TOOLS) == "TOOLS1"


def test_chat_template_jinja_file_wins(tmp_path):
    path = make_model_dir(tmp_path)
    (path / "chat_template.jinja").write_text("JINJA{{ bos_token }}{{ eos_token }}")
    assert ChatTemplate.from_dir(path).render([{"role": "user", "content": "x"}]) == (
        "JINJA<s><|im_end|>"
    )


def test_no_template_gives_none(tmp_path):
    assert ChatTemplate.from_dir(make_model_dir(tmp_path, chat_template=None)) is None


@pytest.mark.parametrize(
    "source, messages",
    [
        ("{{ messages[0].content.__class__ }}", [{"role": "user", "content": "x"}]),
        ("{{ messages[5].content | upper }}", [{"role": "user", "content": "x"}]),
        ("{% set ns = namespace(_x=1) %}", [{"role": "user", "content": "x"}]),
        ("{{ 1 / 0 }}", [{"role": "user", "content": "x"}]),
        ("{{ messages }}", []),
        ("{{ messages }}", [5]),
    ],
)
def test_bad_input_or_escape_attempt_is_a_render_error(source, messages):
    template = ChatTemplate(source)
    try:
        out = template.render(messages)
    except TemplateRenderError:
        return
    # Jinja renders an undefined attribute as empty: no error, but nothing leaks.
    assert "class" not in out


def test_syntax_error_is_reported_at_construction():
    with pytest.raises(TemplateRenderError, match="does not compile"):
        ChatTemplate("{% for x in %}")


def test_dict_global_like_transformers():
    template = ChatTemplate("{{ dict(a=1) | tojson }}{{ dict.fromkeys(['x'], 0) | tojson }}")
    assert template.render([{"role": "user", "content": "x"}]) == '{"a": 1}{"x": 0}'


def test_none_values_are_dropped_and_strftime_now_works():
    template = ChatTemplate(
        "{% for m in messages %}{{ 'content' in m }}{% endfor %}{{ strftime_now('%Y') }}"
    )
    out = template.render([{"role": "assistant", "content": None}])
    assert out.startswith("False") and out[5:].isdigit()


def test_developer_becomes_system_where_the_template_does_not_name_it():
    """As vLLM's server renders it: the template never saw a `developer` turn."""
    template = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "developer", "content": [{"type": "text", "text": "D"}]},
    ]
    assert template.render(messages, add_generation_prompt=False) == "<system>S\n\nD<user>U"
    alone = [{"role": "developer", "content": "D"}, {"role": "user", "content": "U"}]
    assert template.render(alone, add_generation_prompt=False) == "<system>D<user>U"
    knows = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'developer' %}[dev]{% endif %}"
        "<{{ m.role }}>{{ m.content }}{% endfor %}"
    )
    assert knows.render(alone, add_generation_prompt=False) == "[dev]<developer>D<user>U"
