import argparse

import pytest

from stator.config import add_flags, from_args
from stator.router import RouterConfig


def parse(argv, env=None) -> RouterConfig:
    parser = argparse.ArgumentParser()
    add_flags(parser, RouterConfig, env=env or {})
    return from_args(RouterConfig, parser.parse_args(argv))


def test_defaults_follow_dynamo():
    config = parse([])
    assert config.router_mode == "round-robin"
    assert config.router_temperature == 0.0
    assert config.router_kv_events is True
    assert config.router_ttl == 120.0 and config.router_max_tree_size == 2**20
    assert config.migration_limit is None and config.router_queue_size == 0


def test_overlap_weight_defaults_to_4_and_dynamos_1_is_a_flag_away():
    """Not Dynamo's default (docs/router.md, "Choosing w")."""
    assert parse([]).kv_overlap_score_weight == 4.0
    assert parse(["--kv-overlap-score-weight", "1"]).kv_overlap_score_weight == 1.0


def test_flags_and_env_twins():
    config = parse(
        [
            "--router-mode",
            "kv",
            "--no-router-kv-events",
            "--active-decode-blocks-threshold",
            "0.85",
            "--migration-limit",
            "3",
            "--router-queue-policy",
            "priority",
        ],
        env={"STATOR_ROUTER_TEMPERATURE": "0.5", "STATOR_ROUTER_REPLICA_SYNC": "true"},
    )
    assert config.router_mode == "kv" and config.router_kv_events is False
    assert config.active_decode_blocks_threshold == 0.85
    assert config.migration_limit == 3 and config.router_queue_policy == "priority"
    assert config.router_temperature == 0.5 and config.router_replica_sync is True
    config.validate()


def test_bad_mode_is_refused_by_the_parser():
    with pytest.raises(SystemExit):
        parse(["--router-mode", "sticky"])


@pytest.mark.parametrize(
    "field,value",
    [
        ("router_mode", "sticky"),
        ("kv_overlap_score_weight", -1.0),
        ("router_temperature", -0.1),
        ("router_queue_size", -1),
        ("migration_limit", -1),
        ("active_decode_blocks_threshold", 0.0),
        ("router_kv_index_jump", 0),
    ],
)
def test_validate(field, value):
    config = RouterConfig(**{field: value})
    with pytest.raises(ValueError):
        config.validate()


def test_every_flag_is_documented():
    import dataclasses
    from pathlib import Path

    from stator.config import flag_name

    doc = (Path(__file__).resolve().parents[2] / "docs" / "router.md").read_text()
    for field in dataclasses.fields(RouterConfig):
        assert f"`{flag_name(field)}" in doc, f"{flag_name(field)} missing from docs/router.md"
