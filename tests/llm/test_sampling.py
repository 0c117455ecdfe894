from __future__ import annotations

import pytest

from stator.llm.sampling import InvalidParam, build_sampling
from stator.protocols import GuidedDecoding

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


def chat(**fields):
    return {**CHAT, **fields}


def test_full_mapping():
    plan = build_sampling(
        chat(
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            min_p=0.05,
            seed=7,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            repetition_penalty=1.1,
            logit_bias={"5": 10, "7": -100},
            stop=["\n\n", "END", "END"],
            max_completion_tokens=20,
            min_tokens=2,
            ignore_eos=True,
            logprobs=True,
            top_logprobs=3,
            n=2,
            stop_token_ids=[9],
        ),
        eos_token_ids=[2, 2, 3],
        vocab_size=100,
    )
    s, c, stops = plan
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed) == (0.5, 0.9, 40, 0.05, 7)
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.5, -0.5, 1.1)
    assert s.logit_bias == {5: 10.0, 7: -100.0}
    assert s.logprobs == 3 and s.n == 2
    assert (c.max_tokens, c.min_tokens, c.ignore_eos) == (20, 2, True)
    assert c.stop_token_ids == [9] and c.stop_token_ids_hidden == [2, 3]
    assert stops == ["\n\n", "END"]


def test_generation_config_defaults_apply_only_when_omitted():
    gen = {"temperature": 0.7, "top_k": 20, "repetition_penalty": 1.05}
    s = build_sampling(chat(), generation_config=gen).sampling
    assert (s.temperature, s.top_k, s.repetition_penalty) == (0.7, 20, 1.05)
    s = build_sampling(chat(temperature=0, top_k=None), generation_config=gen).sampling
    assert (s.temperature, s.top_k) == (0.0, 20)  # null counts as omitted


def test_max_tokens_defaults_to_the_rest_of_the_context():
    c = build_sampling(chat(), prompt_tokens=100, context_length=2048).stop
    assert c.max_tokens == 1948
    gen = {"max_new_tokens": 50}
    c = build_sampling(chat(), generation_config=gen, prompt_tokens=100, context_length=2048).stop
    assert c.max_tokens == 50
    c = build_sampling(chat(max_tokens=10, max_completion_tokens=30)).stop
    assert c.max_tokens == 30  # the newer name wins


def test_prompt_plus_max_tokens_over_context_names_both_numbers():
    with pytest.raises(InvalidParam) as err:
        build_sampling(chat(max_tokens=1000), prompt_tokens=1500, context_length=2048)
    assert err.value.param == "max_tokens"
    assert "2048" in err.value.message and "1500" in err.value.message
    assert "1000" in err.value.message
    with pytest.raises(InvalidParam, match="2048") as err:
        build_sampling(COMPLETION, prompt_tokens=2048, context_length=2048)
    assert err.value.param == "prompt"


def test_completion_logprobs_and_top_k_disable():
    s = build_sampling({**COMPLETION, "logprobs": 5, "top_k": -1}).sampling
    assert s.logprobs == 5 and s.top_k is None
    assert build_sampling(chat(logprobs=True)).sampling.logprobs == 0
    assert build_sampling(chat(logprobs=False)).sampling.logprobs is None
    assert build_sampling(COMPLETION).sampling.logprobs is None


def test_stop_as_string():
    assert build_sampling(chat(stop="###")).stop_strings == ["###"]


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"seed": 2**70}, "seed"),
        ({"seed": True}, "seed"),
        ({"n": 0}, "n"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"100": 1}}, "logit_bias"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
        ({"stop": ["ok", 5]}, "stop"),
        ({"stop": ""}, "stop"),
        ({"stop": {"a": 1}}, "stop"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": -5}, "max_completion_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 10, "max_tokens": 5}, "min_tokens"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"logprobs": 3}, "logprobs"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stop_token_ids": [1000]}, "stop_token_ids"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_regex": 5}, "guided_regex"),
        ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice"),
    ],
)
def test_bad_params_name_the_parameter(fields, param):
    with pytest.raises(InvalidParam) as err:
        build_sampling(chat(**fields), vocab_size=100)
    assert err.value.param == param
    assert err.value.message


def test_completion_logprobs_range():
    with pytest.raises(InvalidParam) as err:
        build_sampling({**COMPLETION, "logprobs": 6})
    assert err.value.param == "logprobs"


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, GuidedDecoding(json_object=True)),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
                }
            },
            GuidedDecoding(json_schema={"type": "object"}),
        ),
        ({"guided_json": '{"type": "integer"}'}, GuidedDecoding(json_schema={"type": "integer"})),
        ({"guided_regex": "[a-z]+"}, GuidedDecoding(regex="[a-z]+")),
        ({"guided_choice": ["yes", "no"]}, GuidedDecoding(choice=["yes", "no"])),
        ({"guided_grammar": "root ::= 'a'"}, GuidedDecoding(grammar="root ::= 'a'")),
        ({"structured_outputs": {"regex": "x"}}, GuidedDecoding(regex="x")),
        (
            {"guided_json": {"type": "object"}, "guided_whitespace_pattern": r"[ ]?"},
            GuidedDecoding(json_schema={"type": "object"}, whitespace_pattern=r"[ ]?"),
        ),
    ],
)
def test_guided_decoding(fields, expected):
    assert build_sampling(chat(**fields)).sampling.guided_decoding == expected


def test_stop_strings_are_bounded_in_count_and_length():
    from stator.llm.stop_strings import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS

    with pytest.raises(InvalidParam, match="At most"):
        build_sampling({**COMPLETION, "stop": [str(i) for i in range(MAX_STOP_STRINGS + 1)]})
    with pytest.raises(InvalidParam, match="at most"):
        build_sampling({**COMPLETION, "stop": "x" * (MAX_STOP_STRING_CHARS + 1)})
