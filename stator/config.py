"""The one configuration idiom: a dataclass per part, flags generated from it.

Each field of a config dataclass becomes a flag `--field-name`, with an environment twin
`STATOR_FIELD_NAME`. Precedence: command line > environment > dataclass default. `--help`
prints the default and the env var of every flag. Parts never read the environment
themselves; they receive a config object.

    @dataclass
    class FooConfig:
        port: int = option(8000, "HTTP port")
        debug: bool = option(False, "Log more")

    add_flags(parser, FooConfig)            # while building the CLI
    cfg = from_args(FooConfig, namespace)   # after parsing
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")
ENV_PREFIX = "STATOR_"


def option(
    default: Any,
    help: str,
    *,
    choices: list[str] | None = None,
    flag: str | None = None,
    metavar: str | None = None,
    aliases: tuple[str, ...] = (),
    secret: bool = False,
) -> Any:
    """A config field with its help text (and, optionally, choices, a custom flag name, or
    older flag names kept as `aliases`; an alias a parser already has for another flag is
    left out there)."""
    meta = {"help": help, "choices": choices, "flag": flag, "metavar": metavar}
    meta["aliases"] = tuple(aliases)
    meta["secret"] = secret  # --help never shows its value (e.g. an API key from the env)
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(inner type, optional?) for `X | None` annotations."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _converter(tp: Any, optional: bool) -> Any:
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp) or (str,)
        inner = _converter(item, False)

        def to_list(text: str) -> list:
            return [inner(p.strip()) for p in text.split(",") if p.strip()]

        return to_list
    base = {bool: _parse_bool, int: int, float: float}.get(tp, str)
    if not optional:
        return base

    def maybe(text: str) -> Any:
        if text.strip().lower() in ("", "none", "null"):
            return None
        return base(text)

    return maybe


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    env: Mapping[str, str] | None = None,
    skip: set[str] | frozenset[str] = frozenset(),
) -> None:
    """Add one flag per field of dataclass `cls`. The default shown is the env value when
    the env twin is set, else the dataclass default."""
    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        tp, optional = _base_type(hints[f.name])
        convert = _converter(tp, optional)
        default = _default(f)
        var = env_name(f.name)
        if var in env:
            try:
                default = convert(env[var])
            except ValueError as exc:
                raise SystemExit(f"invalid value for {var}: {exc}") from exc
            choices = f.metadata.get("choices")
            if (
                choices
                and default is not None
                and not isinstance(default, list)
                and default not in choices
            ):
                # argparse checks a flag's value against its choices, never a default's.
                raise SystemExit(
                    f"invalid value for {var}: {env[var]!r} (choose from {', '.join(choices)})"
                )
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        if f.metadata.get("secret") and default:
            shown = "(set)"
        help_text = f"{f.metadata.get('help', '')} (default: {shown}; env {var})"
        help_text = help_text.replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": f.name, "default": default, "help": help_text}
        if tp is bool and not optional:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = convert
            if typing.get_origin(tp) is list:
                kwargs["action"] = _Accumulate
            if f.metadata.get("choices"):
                kwargs["choices"] = f.metadata["choices"]
            if f.metadata.get("metavar"):
                kwargs["metavar"] = f.metadata["metavar"]
        taken = _option_strings(parser)
        aliases = [a for a in f.metadata.get("aliases", ()) if a not in taken]
        parser.add_argument(flag_name(f), *aliases, **kwargs)


class _Accumulate(argparse.Action):
    """A list flag: comma-separated, and repeatable (`--api-key a --api-key b`); the first
    use replaces the default (or the env twin's value), later ones add to it."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        current = getattr(namespace, self.dest, None)
        if current is self.default or current is None:
            current = []
        setattr(namespace, self.dest, [*current, *values])


def _option_strings(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> set[str]:
    # An argument group shares its parser's table of option strings.
    return set(getattr(parser, "_option_string_actions", {}))


def from_args(cls: type[T], namespace: argparse.Namespace, **overrides: Any) -> T:
    """Build `cls` from parsed flags (fields absent from the namespace keep defaults)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.init and hasattr(namespace, f.name):
            values[f.name] = getattr(namespace, f.name)
    values.update(overrides)
    return cls(**values)


def from_env(cls: type[T], env: Mapping[str, str] | None = None, **overrides: Any) -> T:
    """Build `cls` from defaults and `STATOR_*` variables only (for library users)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_flags(parser, cls, env=env)
    return from_args(cls, parser.parse_args([]), **overrides)
