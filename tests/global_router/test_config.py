"""Config validation: every malformed field fails at load with a message naming it."""

from __future__ import annotations

import copy
import json

import pytest

from stator.global_router import ConfigError, load_config, parse_config

DYNAMO = {
    "num_prefill_pools": 2,
    "num_decode_pools": 2,
    "prefill_pool_dynamo_namespaces": ["p-fast", "p-slow"],
    "decode_pool_dynamo_namespaces": ["d-fast", "d-slow"],
    "prefill_pool_selection_strategy": {
        "isl_min": 0,
        "isl_max": 8000,
        "isl_resolution": 2,
        "ttft_min": 10,
        "ttft_max": 1010,
        "ttft_resolution": 2,
        "prefill_pool_mapping": [[0, 1], [0, 0]],
        "priority_overrides": [{"min_priority": 5, "max_priority": 9, "target_pool": 1}],
    },
    "decode_pool_selection_strategy": {
        "context_length_min": 0,
        "context_length_max": 16000,
        "context_length_resolution": 1,
        "itl_min": 5,
        "itl_max": 105,
        "itl_resolution": 2,
        "decode_pool_mapping": [[0, 1]],
    },
}


def test_dynamo_config_loads_from_json_and_yaml(tmp_path):
    as_json = tmp_path / "pools.json"
    as_json.write_text(json.dumps(DYNAMO))
    as_yaml = tmp_path / "pools.yaml"
    import yaml

    as_yaml.write_text(yaml.safe_dump(DYNAMO))
    a, b = load_config(as_json), load_config(as_yaml)
    assert a == b
    assert a.prefill_namespaces == ("p-fast", "p-slow")
    assert a.prefill_grid.mapping == ((0, 1), (0, 0))
    assert a.decode_grid.y_resolution == 2
    assert a.prefill_grid.overrides[0].target_pool == 1
    assert a.namespaces == ["p-fast", "p-slow", "d-fast", "d-slow"]


def test_short_spellings_and_implied_counts():
    config = parse_config(
        {
            "decode_pool_namespaces": ["a", "b"],
            "decode_pool_selection_strategy": DYNAMO["decode_pool_selection_strategy"],
        }
    )
    assert config.prefill_grid is None and config.prefill_namespaces == ()
    assert config.decode_namespaces == ("a", "b")


def broken(path: str, value):
    data = copy.deepcopy(DYNAMO)
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if value is KeyError:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


@pytest.mark.parametrize(
    "path,value,message",
    [
        ("num_prefill_pools", 3, "num_prefill_pools is 3 but 2"),
        ("prefill_pool_dynamo_namespaces", ["x", "x"], "twice"),
        ("prefill_pool_dynamo_namespaces", "x", "list of non-empty strings"),
        ("prefill_pool_selection_strategy", KeyError, "prefill_pool_selection_strategy is missing"),
        ("prefill_pool_selection_strategy.isl_max", 0, "isl_min (0) must be less than isl_max"),
        ("prefill_pool_selection_strategy.isl_min", "zero", "isl_min must be a number"),
        (
            "prefill_pool_selection_strategy.ttft_resolution",
            0,
            "ttft_resolution must be a positive",
        ),
        (
            "prefill_pool_selection_strategy.isl_resolution",
            1.5,
            "isl_resolution must be a positive",
        ),
        ("prefill_pool_selection_strategy.prefill_pool_mapping", [[0, 1]], "must be 2 rows"),
        ("prefill_pool_selection_strategy.prefill_pool_mapping.1", [0], "[1] must have 2 entries"),
        ("prefill_pool_selection_strategy.prefill_pool_mapping.1", [0, 2], "[1][1] = 2 is not"),
        ("prefill_pool_selection_strategy.prefill_pool_mapping.1", [0, True], "[1][1] = True"),
        (
            "prefill_pool_selection_strategy.priority_overrides",
            [{"min_priority": 9, "max_priority": 5, "target_pool": 0}],
            "min_priority 9 > max_priority 5",
        ),
        (
            "prefill_pool_selection_strategy.priority_overrides",
            [{"min_priority": 1, "max_priority": 5, "target_pool": 7}],
            "target_pool 7 is not a prefill pool",
        ),
        ("decode_pool_selection_strategy.decode_pool_mapping", [[0, 5]], "[0][1] = 5"),
        ("decode_pool_selection_strategy.itl_min", 105, "itl_min (105) must be less than"),
    ],
)
def test_validation_errors_name_the_field(path, value, message):
    with pytest.raises(ConfigError) as info:
        parse_config(broken(path, value), source="pools.yaml")
    assert message in str(info.value)
    assert str(info.value).startswith("pools.yaml: ")


def test_no_pools_and_not_a_mapping():
    with pytest.raises(ConfigError, match="no pools"):
        parse_config({})
    with pytest.raises(ConfigError, match="must be a mapping"):
        parse_config([1, 2])


def test_unreadable_and_unparsable_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid JSON/YAML"):
        load_config(bad)
