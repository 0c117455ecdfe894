"""Speculative decoding: greedy output identical to plain decoding (prompt lookup, a tiny
draft model, the target as its own draft), exact rejection sampling, acceptance metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from stator.engines.native.request import SamplingSpec, Sequence
from stator.engines.native.sampler import Sampler
from stator.engines.native.spec import SpeculativeConfig
from stator.engines.native.spec.ngram import ngram_draft
from stator.engines.native.spec.verify import DraftGroup, verify
from stator.protocols import EngineRequest, GuidedDecoding, SamplingOptions, StopConditions
from tests.engines.native.models import (
    core_for,
    greedy_request,
    prompt,
    rerandomize,
    run_all,
    tokens_of,
)
from tests.model_factory import make_model_dir


@pytest.fixture(scope="module")
def tiny_draft(llama, tmp_path_factory) -> Path:
    """A 1-layer, narrower Llama of the target's vocabulary (poor acceptance)."""
    target_dir, _ = llama
    path = tmp_path_factory.mktemp("draft") / "model"
    make_model_dir(path)
    vocab = json.loads((target_dir / "config.json").read_text())["vocab_size"]
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=512,
        vocab_size=vocab,
        bos_token_id=1,
        eos_token_id=5,
    )
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    rerandomize(model, seed=3)
    model.save_pretrained(path)
    return path


def spec_config(method: str, k: int = 3, model: Path | None = None) -> str:
    value: dict = {"method": method, "num_speculative_tokens": k}
    if model is not None:
        value["model"] = str(model)
    return json.dumps(value)


def repetitive_requests(max_tokens: int = 30) -> list[EngineRequest]:
    # Repeated prompt segments give prompt lookup something to find.
    return [
        greedy_request(f"r{i}", prompt(i, 7) * 3 + prompt(i + 50, 5), max_tokens + 3 * i)
        for i in range(4)
    ]


def test_config_parsing():
    assert SpeculativeConfig.parse("") is None
    c = SpeculativeConfig.parse('{"method": "[ngram]", "num_speculative_tokens": 5}')
    assert c.method == "ngram" and c.num_speculative_tokens == 5
    c = SpeculativeConfig.parse({"model": "/d", "num_speculative_tokens": 2})
    assert c.method == "draft_model" and c.model == "/d"
    assert SpeculativeConfig.parse({"method": "eagle", "model": "/e", "num_speculative_tokens": 1})
    for bad, needle in [
        ("{nope", "not JSON"),
        ({"method": "medusa", "num_speculative_tokens": 2}, "method"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs a model"),
        ({"method": "ngram", "num_speculative_tokens": 2, "typo": 1}, "unknown keys"),
    ]:
        with pytest.raises(ValueError, match=needle):
            SpeculativeConfig.parse(bad)


def test_ngram_drafts_continue_the_latest_match():
    tokens = [1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 1, 2, 3]
    assert ngram_draft(tokens, 2, max_n=3, min_n=1) == [5, 6]  # the most recent "1 2 3"
    assert ngram_draft(tokens, 10, max_n=3, min_n=1) == [5, 6, 7, 1, 2, 3]
    assert ngram_draft([1, 2, 3, 4], 3, max_n=3, min_n=1) == []
    assert ngram_draft([5, 5], 2, max_n=2, min_n=1) == [5]


@pytest.mark.parametrize("method", ["ngram", "tiny_draft", "self_draft"])
def test_greedy_output_is_identical_to_plain_decoding(llama, tiny_draft, method):
    target, _ = llama
    plain = run_all(core_for(target), repetitive_requests())
    if method == "ngram":
        config = spec_config("ngram")
    else:
        config = spec_config("draft_model", model=tiny_draft if method == "tiny_draft" else target)
    core = core_for(target, speculative_config=config)
    out = run_all(core, repetitive_requests())
    for rid, outputs in plain.items():
        assert tokens_of(out[rid]) == tokens_of(outputs), rid
        assert out[rid][-1].finish_reason == "length"
        assert out[rid][-1].usage.completion_tokens == len(tokens_of(outputs))
    stats = core.specdec.stats
    assert stats.steps > 0
    if method == "self_draft":  # the target drafting for itself: every draft is right
        assert stats.acceptance_rate == 1.0 and stats.mean_accepted_length > 3.5  # k = 3
        assert len(out["r0"]) < len(plain["r0"]) / 3  # several tokens per output
    if method == "tiny_draft":
        assert stats.acceptance_rate < 0.5


def test_full_verification_steps_are_marked_for_the_verify_graphs(llama):
    """A step where every sequence verifies k drafts has k + 1 rows per sequence (what
    the verify CUDA graphs replay); EAGLE-3 and no speculation get no such graphs."""
    from stator.engines.native.spec.config import verify_tokens

    assert verify_tokens(spec_config("ngram", 4)) == 5
    assert verify_tokens(spec_config("draft_model", 2, Path("/d"))) == 3
    assert verify_tokens(spec_config("eagle3", 3, Path("/d"))) == 0
    assert verify_tokens("") == 0
    target, _ = llama
    core = core_for(target, speculative_config=spec_config("draft_model", model=target))
    seen = []
    execute = core.runner.execute
    core.runner.execute = lambda inputs: seen.append(inputs.rows_per_seq) or execute(inputs)
    run_all(core, repetitive_requests())
    assert 4 in seen  # k = 3: full verification steps
    assert 1 in seen or 0 in seen  # prefill (0) and the draft-free tail (1) differ


def test_mixed_batch_with_chunked_prefill_and_preemption(llama):
    """Speculating sequences beside ones that cannot (penalties, logprobs, a grammar),
    small prefill chunks and a KV cache small enough to preempt: greedy is unchanged."""
    target, _ = llama

    def requests():
        reqs = repetitive_requests(24)
        reqs.append(greedy_request("pen", prompt(9, 20), 12, repetition_penalty=1.3))
        reqs.append(greedy_request("lp", prompt(10, 20), 12, logprobs=2))
        reqs.append(
            greedy_request(
                "json", prompt(11, 9), 40, guided_decoding=GuidedDecoding(regex="[ab]{8}")
            )
        )
        return reqs

    small = {"kv_cache_memory": "96KiB", "max_prefill_chunk": 8, "max_num_batched_tokens": 32}
    plain = run_all(core_for(target, **small), requests())
    core = core_for(target, speculative_config=spec_config("draft_model", 4, target), **small)
    out = run_all(core, requests())
    for rid, outputs in plain.items():
        assert tokens_of(out[rid]) == tokens_of(outputs), rid
    assert core.scheduler.num_preemptions > 0
    assert len(out["lp"]) == 12 and all(o.logprobs for o in out["lp"])


def test_sampled_requests_run_and_stop_on_eos(llama):
    target, _ = llama
    core = core_for(target, speculative_config=spec_config("draft_model", 3, target))
    reqs = [
        EngineRequest(
            request_id=f"s{i}",
            model="m",
            token_ids=prompt(i, 10),
            sampling=SamplingOptions(temperature=0.8, top_p=0.9, seed=i),
            stop=StopConditions(max_tokens=25, stop_token_ids_hidden=[5]),
        )
        for i in range(6)
    ]
    out = run_all(core, reqs)
    for outputs in out.values():
        assert outputs[-1].finish_reason in ("stop", "length")
        assert 5 not in tokens_of(outputs)
        assert len(tokens_of(outputs)) <= 25
    assert core.specdec.stats.acceptance_rate > 0.9  # same model, same sampling law


# -- rejection sampling keeps the target's distribution ---------------------------------


def _seq(temperature: float = 1.0) -> Sequence:
    return Sequence("x", [0], 1, SamplingSpec(temperature=temperature), max_total_tokens=100)


def test_rejection_sampling_keeps_the_target_distribution():
    torch.manual_seed(0)
    vocab, trials = 6, 4000
    p0 = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.07, 0.03])
    p1 = torch.tensor([0.05, 0.05, 0.1, 0.2, 0.3, 0.3])
    q0 = torch.tensor([0.1, 0.1, 0.5, 0.1, 0.1, 0.1])  # a poor draft
    q1 = torch.tensor([0.3, 0.3, 0.1, 0.1, 0.1, 0.1])
    sampler = Sampler(vocab, torch.device("cpu"), seed=1)
    logits = torch.stack([p0.log(), p1.log(), p1.log()])
    groups = []
    rows = []
    for t in range(trials):
        d0 = int(torch.multinomial(q0, 1))
        d1 = int(torch.multinomial(q1, 1))
        rows.append(logits)
        groups.append(DraftGroup(_seq(), 3 * t, [d0, d1], torch.stack([q0, q1])))
    results = verify(sampler, torch.cat(rows), groups)
    first = torch.bincount(torch.tensor([r[0] for r in results]), minlength=vocab).float()
    _assert_follows(first, p0, trials)
    # Given the first draft was kept, the next token follows p1.
    second = [r[1] for r, g in zip(results, groups, strict=True) if len(r) > 1]
    counts = torch.bincount(torch.tensor(second), minlength=vocab).float()
    _assert_follows(counts, p1, len(second))
    # Deterministic drafts (prompt lookup): q is one-hot at the draft.
    det = [DraftGroup(_seq(), 3 * t, [2, 4]) for t in range(trials)]
    first = torch.bincount(
        torch.tensor([r[0] for r in verify(sampler, torch.cat(rows), det)]), minlength=vocab
    ).float()
    _assert_follows(first, p0, trials)


def _assert_follows(counts: torch.Tensor, p: torch.Tensor, n: int) -> None:
    """Pearson chi-square at 5 degrees of freedom; 20.5 is its 0.999 quantile."""
    expected = p * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5, (counts.tolist(), expected.tolist())


def test_greedy_rejection_is_the_argmax():
    sampler = Sampler(4, torch.device("cpu"))
    logits = torch.tensor([[0.0, 3.0, 1.0, 0.0], [2.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 5.0]])
    seq = _seq(temperature=0.0)
    assert verify(sampler, logits, [DraftGroup(seq, 0, [1, 0])]) == [[1, 0, 3]]
    assert verify(sampler, logits, [DraftGroup(seq, 0, [1, 3])]) == [[1, 0]]
    assert verify(sampler, logits, [DraftGroup(seq, 0, [2, 0])]) == [[1]]


# -- EAGLE-3 -------------------------------------------------------------------------------


def write_eagle3(path: Path, target_dir: Path, *, draft_vocab: int = 300, seed: int = 0) -> Path:
    """A random EAGLE-3 head in the released checkpoints' format (names, shapes, d2t)."""
    from safetensors.torch import save_file

    target = json.loads((target_dir / "config.json").read_text())
    h, vocab = target["hidden_size"], target["vocab_size"]
    heads, kv, hd, inter = 4, 2, 16, 96
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": h,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "eagle_aux_hidden_state_layer_ids": [0, 1, 2],
    }
    (path / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 0.1) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    ids = torch.sort(torch.randperm(vocab, generator=gen)[:draft_vocab]).values
    weights = {
        "fc.weight": rand(h, 3 * h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": rand(heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, heads * hd),
        "midlayer.mlp.gate_proj.weight": rand(inter, h),
        "midlayer.mlp.up_proj.weight": rand(inter, h),
        "midlayer.mlp.down_proj.weight": rand(h, inter),
        "norm.weight": torch.ones(h),
        "lm_head.weight": rand(draft_vocab, h, scale=1.0),
        "d2t": ids - torch.arange(draft_vocab),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True),
    }
    save_file(weights, str(path / "model.safetensors"))
    return path


def test_eagle3_head_drafts_and_greedy_is_unchanged(llama, tmp_path):
    target, _ = llama
    head = write_eagle3(tmp_path / "eagle3", target)
    plain = run_all(core_for(target), repetitive_requests())
    core = core_for(target, speculative_config=spec_config("eagle3", 3, head))
    out = run_all(core, repetitive_requests())
    for rid, outputs in plain.items():
        assert tokens_of(out[rid]) == tokens_of(outputs), rid
    proposer = core.specdec.model
    assert core.runner.model.model.aux_layers == (0, 1, 2)
    stats = core.specdec.stats
    assert stats.steps > 0 and stats.drafted > 0
    # Drafts come from the head's vocabulary, mapped through d2t.
    assert proposer.draft_ids.shape[0] == 300


def test_eagle3_checkpoint_must_have_every_weight(llama, tmp_path):
    from safetensors.torch import load_file, save_file

    target, _ = llama
    head = write_eagle3(tmp_path / "eagle3", target)
    weights = load_file(str(head / "model.safetensors"))
    del weights["fc.weight"]
    save_file(weights, str(head / "model.safetensors"))
    with pytest.raises(ValueError, match=r"fc\.weight"):
        core_for(target, speculative_config=spec_config("eagle3", 2, head))
