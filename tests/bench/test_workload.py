import itertools
import json

import pytest

from stator.bench.config import BenchConfig
from stator.bench.prompts import PromptSource
from stator.bench.schedule import arrival_times
from stator.bench.workload import from_trace, load_trace, synthetic


def test_prompts_are_deterministic_and_exact_with_a_tokenizer(tiny_model_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    a = PromptSource(1, str(tiny_model_dir))
    b = PromptSource(1, str(tiny_model_dir))
    assert a.text(300, "k") == b.text(300, "k")
    assert a.text(300, "k") != a.text(300, "j")
    assert PromptSource(2, str(tiny_model_dir)).text(300, "k") != a.text(300, "k")
    for n in (1, 17, 512):
        assert len(tok.encode(a.text(n, n)).ids) == n


def test_synthetic_lengths_prefixes_and_seed():
    cfg = BenchConfig(isl=100, osl=8, prefix_ratio=0.5, num_prefixes=2, seed=3)
    specs = synthetic(cfg, 20)
    assert [s.max_tokens for s in specs] == [8] * 20
    shared = [PromptSource(3).text(50, f"prefix:{p}") for p in range(2)]
    used = {next(i for i, p in enumerate(shared) if s.prompt.startswith(p)) for s in specs}
    assert used == {0, 1}
    assert len({s.prompt for s in specs}) == 20
    assert [s.prompt for s in synthetic(cfg, 20)] == [s.prompt for s in specs]
    other = synthetic(cfg, 20, salt="warmup")
    assert not {s.prompt for s in other} & {s.prompt for s in specs}


def test_length_distribution():
    cfg = BenchConfig(isl=200, isl_std=50, osl=30, osl_std=10, seed=1)
    specs = synthetic(cfg, 200)
    isls = [s.input_tokens for s in specs]
    assert 170 < sum(isls) / len(isls) < 230
    assert len(set(isls)) > 20
    assert min(s.max_tokens for s in specs) >= 1


def test_trace_prompts_share_blocks(tmp_path):
    rows = [
        {"timestamp": 1000, "input_length": 30, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 1500, "input_length": 25, "output_length": 0, "hash_ids": [1, 3]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = BenchConfig(trace_block_size=16, time_scale=2.0)
    specs = from_trace(cfg, load_trace(path))
    assert [s.arrival for s in specs] == [0.0, 1.0]
    assert specs[1].max_tokens == 1
    first_block = PromptSource(0).text(16, "block:1:16")
    assert specs[0].prompt.startswith(first_block) and specs[1].prompt.startswith(first_block)
    assert specs[0].prompt != specs[1].prompt


def test_bad_trace(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        load_trace(path)


def test_arrivals():
    const = arrival_times(10, 5, "constant")
    assert const == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    pois = arrival_times(100, 2000, "poisson", seed=1)
    assert pois == arrival_times(100, 2000, "poisson", seed=1)
    assert 17 < pois[-1] < 23
    bursty = arrival_times(100, 2000, "gamma", burstiness=0.2, seed=1)
    gaps = [b - a for a, b in itertools.pairwise(bursty)]
    mean = sum(gaps) / len(gaps)
    var = sum((g - mean) ** 2 for g in gaps) / len(gaps)
    assert var / mean**2 > 2.5  # coefficient of variation² = 1/shape = 5 for gamma(0.2)
    with pytest.raises(ValueError):
        arrival_times(0, 3)
