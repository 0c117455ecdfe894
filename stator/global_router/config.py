"""The global router's pool-selection config: which pools exist and the two grids that map
a request to them. Read from JSON or YAML, validated at load time with errors that name
the offending field.

The format is Dynamo's (`components/src/dynamo/global_router/pool_selection.py`), so a
Dynamo config loads unchanged:

    num_prefill_pools: 2
    num_decode_pools: 1
    prefill_pool_dynamo_namespaces: [prefill-short, prefill-long]
    decode_pool_dynamo_namespaces: [decode]
    prefill_pool_selection_strategy:
      isl_min: 0          isl_max: 8000      isl_resolution: 2
      ttft_min: 10        ttft_max: 1000     ttft_resolution: 2
      prefill_pool_mapping: [[0, 1], [1, 1]]      # [isl index][ttft index]
      priority_overrides: [{min_priority: 5, max_priority: 9, target_pool: 0}]
    decode_pool_selection_strategy:
      context_length_min: 0  context_length_max: 16000  context_length_resolution: 1
      itl_min: 5             itl_max: 100               itl_resolution: 1
      decode_pool_mapping: [[0]]

stator accepts `prefill_pool_namespaces` / `decode_pool_namespaces` as shorter spellings,
lets the counts be implied by the namespace lists, and allows zero prefill pools (an
aggregated fleet picked by the decode grid alone) or zero decode pools (aggregated pools
picked by the prefill grid alone).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """The config file is malformed; the message names the field."""


@dataclass(frozen=True, slots=True)
class PriorityOverride:
    min_priority: int
    max_priority: int
    target_pool: int


@dataclass(frozen=True, slots=True)
class Grid:
    """A 2-D lookup: (x, y) -> pool. `x` is the ISL or context length, `y` the TTFT or
    ITL target in milliseconds; `mapping[x_index][y_index]` is a pool index."""

    x_name: str
    x_min: float
    x_max: float
    x_resolution: int
    y_name: str
    y_min: float
    y_max: float
    y_resolution: int
    mapping: tuple[tuple[int, ...], ...]
    overrides: tuple[PriorityOverride, ...] = ()

    def x_index(self, x: float) -> int:
        return _index(x, self.x_min, self.x_max, self.x_resolution)

    def y_index(self, y: float) -> int:
        return _index(y, self.y_min, self.y_max, self.y_resolution)

    @property
    def y_midpoint(self) -> float:
        return (self.y_min + self.y_max) / 2

    def cells(self, pool: int) -> list[tuple[int, int]]:
        return [
            (i, j) for i, row in enumerate(self.mapping) for j, p in enumerate(row) if p == pool
        ]


def _index(value: float, lo: float, hi: float, resolution: int) -> int:
    """Dynamo's bucket: int((value - lo) / step), clamped to the grid."""
    step = (hi - lo) / resolution
    return min(max(int((value - lo) / step), 0), resolution - 1)


@dataclass(frozen=True, slots=True)
class PoolSelectionConfig:
    prefill_namespaces: tuple[str, ...]
    decode_namespaces: tuple[str, ...]
    prefill_grid: Grid | None
    decode_grid: Grid | None
    source: str = field(default="<dict>", compare=False)

    @property
    def namespaces(self) -> list[str]:
        """Every pool namespace, each once (a namespace may be in both lists)."""
        return list(dict.fromkeys([*self.prefill_namespaces, *self.decode_namespaces]))


def load_config(path: str | Path) -> PoolSelectionConfig:
    """Read and validate a JSON or YAML file (YAML is a superset of JSON)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read global router config {path}: {exc}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid JSON/YAML: {exc}") from exc
    return parse_config(data, source=str(path))


def parse_config(data: Any, source: str = "<dict>") -> PoolSelectionConfig:
    where = f"{source}: "
    if not isinstance(data, dict):
        raise ConfigError(f"{where}the config must be a mapping, got {type(data).__name__}")
    try:
        prefill = _namespaces(data, "prefill")
        decode = _namespaces(data, "decode")
        if not prefill and not decode:
            raise ConfigError("no pools: give prefill_pool_namespaces or decode_pool_namespaces")
        prefill_grid = _grid(data, "prefill", len(prefill)) if prefill else None
        decode_grid = _grid(data, "decode", len(decode)) if decode else None
    except ConfigError as exc:
        raise ConfigError(where + str(exc)) from None
    return PoolSelectionConfig(tuple(prefill), tuple(decode), prefill_grid, decode_grid, source)


def _namespaces(data: dict, role: str) -> list[str]:
    names = data.get(f"{role}_pool_dynamo_namespaces", data.get(f"{role}_pool_namespaces"))
    if names is None:
        names = []
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{role}_pool_namespaces must be a list of non-empty strings")
    if len(set(names)) != len(names):
        raise ConfigError(f"{role}_pool_namespaces lists a namespace twice: {names}")
    count = data.get(f"num_{role}_pools", len(names))
    if not isinstance(count, int) or count != len(names):
        raise ConfigError(
            f"num_{role}_pools is {count!r} but {len(names)} {role} pool namespaces are given"
        )
    return names


_AXES = {
    "prefill": ("isl", "ttft", "prefill_pool_mapping"),
    "decode": ("context_length", "itl", "decode_pool_mapping"),
}


def _grid(data: dict, role: str, pools: int) -> Grid:
    key = f"{role}_pool_selection_strategy"
    strategy = data.get(key)
    if not isinstance(strategy, dict):
        raise ConfigError(f"{key} is missing (a mapping with the grid and its ranges)")
    x, y, mapping_key = _AXES[role]
    x_min, x_max, x_res = _axis(strategy, key, x)
    y_min, y_max, y_res = _axis(strategy, key, y)
    mapping = strategy.get(mapping_key)
    shape = f"{x_res} rows ({x}) of {y_res} pool indices ({y})"
    if not isinstance(mapping, list) or len(mapping) != x_res:
        raise ConfigError(f"{key}.{mapping_key} must be {shape}")
    rows = []
    for i, row in enumerate(mapping):
        if not isinstance(row, list) or len(row) != y_res:
            raise ConfigError(f"{key}.{mapping_key}[{i}] must have {y_res} entries ({shape})")
        for j, pool in enumerate(row):
            if not _is_int(pool) or not 0 <= pool < pools:
                raise ConfigError(
                    f"{key}.{mapping_key}[{i}][{j}] = {pool!r} is not a {role} pool index "
                    f"(0..{pools - 1})"
                )
        rows.append(tuple(row))
    overrides = []
    for n, rule in enumerate(strategy.get("priority_overrides") or []):
        name = f"{key}.priority_overrides[{n}]"
        if not isinstance(rule, dict):
            raise ConfigError(f"{name} must be a mapping")
        lo, hi, target = (rule.get(k) for k in ("min_priority", "max_priority", "target_pool"))
        if not all(_is_int(v) for v in (lo, hi, target)):
            raise ConfigError(f"{name} needs integer min_priority, max_priority, target_pool")
        if lo > hi:
            raise ConfigError(f"{name}: min_priority {lo} > max_priority {hi}")
        if not 0 <= target < pools:
            raise ConfigError(f"{name}: target_pool {target} is not a {role} pool index")
        overrides.append(PriorityOverride(lo, hi, target))
    return Grid(x, x_min, x_max, x_res, y, y_min, y_max, y_res, tuple(rows), tuple(overrides))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _axis(strategy: dict, key: str, name: str) -> tuple[float, float, int]:
    lo, hi, res = (strategy.get(f"{name}_{s}") for s in ("min", "max", "resolution"))
    for suffix, value in (("min", lo), ("max", hi)):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(f"{key}.{name}_{suffix} must be a number, got {value!r}")
    if not lo < hi:
        raise ConfigError(f"{key}: {name}_min ({lo}) must be less than {name}_max ({hi})")
    if not _is_int(res) or res <= 0:
        raise ConfigError(f"{key}.{name}_resolution must be a positive integer, got {res!r}")
    return float(lo), float(hi), res
