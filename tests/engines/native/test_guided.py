"""Structured output in the native engine: every constrained output parses and matches
its constraint, greedy and sampled, alone and in batches mixed with free requests."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from stator.engines.native.guided import InvalidConstraint
from stator.protocols import EngineRequest, GuidedDecoding, SamplingOptions, StopConditions
from tests.engines.native.models import core_for, prompt, run_all, tokens_of

EOS = 5

REAL_SCHEMAS = [
    {  # nested objects, enums, arrays, a pattern
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "maximum": 9999},
                    "email": {"type": "string", "pattern": "^[a-z]{1,6}@[a-z]{1,5}\\.(com|org)$"},
                },
                "required": ["id", "email"],
                "additionalProperties": False,
            },
            "role": {"enum": ["admin", "viewer", "editor"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
            "active": {"type": "boolean"},
        },
        "required": ["user", "role", "tags", "active"],
        "additionalProperties": False,
    },
    {  # an OpenAI-style function schema with optional fields and null
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"type": ["string", "null"], "enum": ["celsius", "fahrenheit", None]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
    {  # an array of records, anyOf
        "type": "array",
        "minItems": 1,
        "maxItems": 3,
        "items": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
                    "required": ["n"],
                    "additionalProperties": False,
                },
                {"type": "string", "maxLength": 4},
            ]
        },
    },
]


@pytest.fixture(scope="module")
def tiny(llama):
    model_dir, _ = llama
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return model_dir, tokenizer


def request(
    rid: str,
    spec: GuidedDecoding | None,
    *,
    temperature: float,
    seed: int = 0,
    max_tokens: int = 160,
) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        model="m",
        token_ids=prompt(seed, 12),
        sampling=SamplingOptions(temperature=temperature, seed=seed, guided_decoding=spec),
        stop=StopConditions(max_tokens=max_tokens, stop_token_ids_hidden=[EOS]),
    )


def text_of(tokenizer: Tokenizer, outputs) -> str:
    return tokenizer.decode(tokens_of(outputs), skip_special_tokens=False)


def check_json(tokenizer, outputs, schema) -> None:
    assert outputs[-1].finish_reason == "stop", text_of(tokenizer, outputs)
    value = json.loads(text_of(tokenizer, outputs))
    jsonschema.validate(value, schema)


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_real_schemas_greedy_and_sampled_in_a_mixed_batch(tiny, overlap):
    model_dir, tokenizer = tiny
    core = core_for(model_dir, overlap=overlap)
    reqs, expect = [], {}
    for i, schema in enumerate(REAL_SCHEMAS):
        for temperature in (0.0, 1.0):
            rid = f"s{i}-t{temperature}"
            reqs.append(
                request(rid, GuidedDecoding(json_schema=schema), temperature=temperature, seed=i)
            )
            expect[rid] = schema
    reqs.append(request("free-greedy", None, temperature=0.0, max_tokens=20))
    reqs.append(request("free-sampled", None, temperature=1.0, seed=9, max_tokens=20))
    reqs.append(request("regex", GuidedDecoding(regex=r"[0-9]{3}-[a-z]{2,4}"), temperature=1.0))
    reqs.append(
        request("choice", GuidedDecoding(choice=["yes", "no", "maybe so"]), temperature=1.0, seed=3)
    )
    reqs.append(request("object", GuidedDecoding(json_object=True), temperature=0.0))
    lark = 'start: "(" num ("+" num)* ")"\nnum: /[1-9]/'
    reqs.append(request("lark", GuidedDecoding(grammar=lark), temperature=1.0, seed=4))
    gbnf = 'root ::= "x" digit digit\ndigit ::= [0-9]'
    reqs.append(request("gbnf", GuidedDecoding(grammar=gbnf), temperature=1.0, seed=5))
    out = run_all(core, reqs)
    for rid, schema in expect.items():
        check_json(tokenizer, out[rid], schema)
    assert len(tokens_of(out["free-greedy"])) == 20
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", text_of(tokenizer, out["regex"]))
    assert text_of(tokenizer, out["choice"]) in ("yes", "no", "maybe so")
    assert isinstance(json.loads(text_of(tokenizer, out["object"])), dict)
    assert re.fullmatch(r"\([1-9](\+[1-9])*\)", text_of(tokenizer, out["lark"]))
    assert re.fullmatch(r"x[0-9][0-9]", text_of(tokenizer, out["gbnf"]))


def test_unconstrained_rows_are_unchanged_by_constrained_neighbours(tiny):
    model_dir, _ = tiny
    core = core_for(model_dir)
    alone = run_all(core, [request("free", None, temperature=0.0, max_tokens=12)])
    mixed = run_all(
        core,
        [
            request("free2", None, temperature=0.0, max_tokens=12),
            request("json", GuidedDecoding(json_schema=REAL_SCHEMAS[1]), temperature=0.0),
        ],
    )
    assert tokens_of(mixed["free2"]) == tokens_of(alone["free"])


def test_greedy_constrained_output_is_the_masked_argmax(tiny):
    """Greedy under a constraint that allows everything is plain greedy."""
    model_dir, _ = tiny
    core = core_for(model_dir)
    free = run_all(core, [request("a", None, temperature=0.0, max_tokens=10)])
    loose = run_all(
        core, [request("b", GuidedDecoding(regex=r"(.|\n)*"), temperature=0.0, max_tokens=10)]
    )
    assert tokens_of(loose["b"]) == tokens_of(free["a"])


def test_invalid_constraint_is_refused_naming_the_field(tiny):
    model_dir, _ = tiny
    core = core_for(model_dir)
    with pytest.raises(InvalidConstraint) as info:
        core.add_request(request("bad", GuidedDecoding(regex="[a-"), temperature=0.0))
    assert info.value.param == "guided_regex"
    assert core.seqs == {}


def test_compiled_grammars_are_cached_per_schema(tiny):
    model_dir, _ = tiny
    core = core_for(model_dir)
    spec = GuidedDecoding(json_schema=REAL_SCHEMAS[1])
    run_all(core, [request(f"r{i}", spec, temperature=1.0, seed=i) for i in range(3)])
    compiler = core.guidance.compiler
    assert compiler.misses == 1 and compiler.hits == 2


# -- random schemas ----------------------------------------------------------------------

_NAMES = st.text(alphabet="abcdefghij", min_size=1, max_size=5)


def _leaf():
    return st.one_of(
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.tuples(st.integers(-50, 50), st.integers(0, 60)).map(
            lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}
        ),
        st.integers(0, 6).map(lambda n: {"type": "string", "maxLength": n}),
        st.lists(
            st.sampled_from(["x", "yy", "zz z", 1, True]), min_size=1, max_size=3, unique=True
        ).map(lambda values: {"enum": values}),
        st.just({"type": "string", "pattern": "^[A-C][0-9]?$"}),
    )


def _schemas():
    return st.recursive(
        _leaf(),
        lambda inner: st.one_of(
            st.tuples(inner, st.integers(0, 3)).map(
                lambda t: {"type": "array", "items": t[0], "maxItems": t[1]}
            ),
            st.dictionaries(_NAMES, inner, min_size=1, max_size=3).flatmap(
                lambda props: st.sets(st.sampled_from(sorted(props))).map(
                    lambda req: {
                        "type": "object",
                        "properties": props,
                        "required": sorted(req),
                        "additionalProperties": False,
                    }
                )
            ),
        ),
        max_leaves=6,
    )


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(schemas=st.lists(_schemas(), min_size=3, max_size=3), seed=st.integers(0, 1000))
def test_random_schemas_always_validate(tiny, schemas, seed):
    model_dir, tokenizer = tiny
    core = core_for(model_dir)
    reqs = []
    for i, schema in enumerate(schemas):
        spec = GuidedDecoding(json_schema=schema)
        reqs.append(request(f"g{i}", spec, temperature=0.0, seed=seed + i, max_tokens=400))
        reqs.append(request(f"s{i}", spec, temperature=1.0, seed=seed + i, max_tokens=400))
    out = run_all(core, reqs)
    for i, schema in enumerate(schemas):
        check_json(tokenizer, out[f"g{i}"], schema)
        check_json(tokenizer, out[f"s{i}"], schema)


def test_overlapped_constrained_step_samples_when_the_next_step_needs_it(tiny):
    """Under overlap a constrained step's masks fill on the grammar thread while the
    host prepares the next step: its tokens are drawn only then, and the outputs are
    those of the synchronous engine, sampled rows and min_tokens rows included."""
    model_dir, tokenizer = tiny

    def reqs():
        spec = GuidedDecoding(json_schema=REAL_SCHEMAS[0])
        out = [request(f"g{i}", spec, temperature=t, seed=i) for i, t in enumerate((0.0, 1.0))]
        out.append(request("free", None, temperature=1.0, seed=7, max_tokens=30))
        late = request("min", GuidedDecoding(json_schema=REAL_SCHEMAS[1]), temperature=1.0)
        late.stop.min_tokens = 5  # sampled eagerly: min_tokens counts output tokens
        out.append(late)
        return out

    sync = run_all(core_for(model_dir, overlap="off"), reqs())
    core = core_for(model_dir, overlap="on")
    for r in reqs():
        core.add_request(r)
    overlapped: dict[str, list] = {r.request_id: [] for r in reqs()}
    lazy_steps = 0
    while core.has_work():
        for rid, out in core.step():
            overlapped[rid].append(out)
        pending = core._pending
        if pending is not None and pending._device_tokens is None:
            lazy_steps += 1
    assert lazy_steps > 0
    for rid, outs in sync.items():
        assert tokens_of(overlapped[rid]) == tokens_of(outs), rid
    check_json(tokenizer, overlapped["g0"], REAL_SCHEMAS[0])
    check_json(tokenizer, overlapped["min"], REAL_SCHEMAS[1])
    assert len(tokens_of(overlapped["min"])) >= 5


def test_mask_fill_runs_off_the_calling_thread(tiny):
    import threading

    model_dir, _ = tiny
    core = core_for(model_dir)
    core.add_request(request("g", GuidedDecoding(json_schema=REAL_SCHEMAS[1]), temperature=0.0))
    core.add_request(request("free", None, temperature=0.0))
    compiler = core.guidance._compiler()
    threads = []
    fill = compiler.fill

    def spy(*args):
        threads.append(threading.current_thread())
        fill(*args)

    compiler.fill = spy
    masks = core.guidance.start_masks([core.seqs["g"], core.seqs["free"]]).result()
    assert threads and threads[0] is not threading.current_thread()
    assert masks.shape == (2, compiler.words)
    assert bool((masks[1] == -1).all())  # an unconstrained row allows everything
    assert not bool((masks[0] == -1).all())
    assert core.guidance.start_masks([core.seqs["free"]]) is None
