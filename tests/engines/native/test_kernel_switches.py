"""Kernel switches read from the environment (`kernels/switches.py`): values they take,
and a clear refusal at import for any other, instead of a failure at the first request."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stator.engines.native.kernels import switches


@pytest.mark.parametrize(
    ("raw", "expected"), [("", True), ("1", True), ("ON", True), ("false", False), ("0", False)]
)
def test_flag_reads_on_and_off(monkeypatch, raw, expected):
    monkeypatch.setenv("STATOR_TEST_SWITCH", raw)
    assert switches.flag("STATOR_TEST_SWITCH", True) is expected


def test_flag_refuses_anything_else_by_name(monkeypatch):
    monkeypatch.setenv("STATOR_TEST_SWITCH", "maybe")
    with pytest.raises(ValueError, match="STATOR_TEST_SWITCH must be 1 or 0"):
        switches.flag("STATOR_TEST_SWITCH", True)


def test_positive_int_reads_the_value_or_the_default(monkeypatch):
    monkeypatch.delenv("STATOR_TEST_SWITCH", raising=False)
    assert switches.positive_int("STATOR_TEST_SWITCH", 16) == 16
    monkeypatch.setenv("STATOR_TEST_SWITCH", " 2 ")
    assert switches.positive_int("STATOR_TEST_SWITCH", 16) == 2


@pytest.mark.parametrize("bad", ["0", "-4", "two", "1.5"])
def test_positive_int_refuses_anything_else_by_name(monkeypatch, bad):
    monkeypatch.setenv("STATOR_TEST_SWITCH", bad)
    with pytest.raises(
        ValueError, match=f"STATOR_TEST_SWITCH must be a positive integer, not '{bad}'"
    ):
        switches.positive_int("STATOR_TEST_SWITCH", 16)


def test_choice_reads_one_of_its_values(monkeypatch):
    monkeypatch.delenv("STATOR_TEST_SWITCH", raising=False)
    assert switches.choice("STATOR_TEST_SWITCH", ("a", "b")) is None
    monkeypatch.setenv("STATOR_TEST_SWITCH", "b")
    assert switches.choice("STATOR_TEST_SWITCH", ("a", "b")) == "b"
    monkeypatch.setenv("STATOR_TEST_SWITCH", "c")
    with pytest.raises(ValueError, match="STATOR_TEST_SWITCH must be one of a, b, not 'c'"):
        switches.choice("STATOR_TEST_SWITCH", ("a", "b"))


def test_parsed_reads_the_value_or_none_and_names_the_switch_in_a_refusal(monkeypatch):
    monkeypatch.delenv("STATOR_TEST_SWITCH", raising=False)
    assert switches.parsed("STATOR_TEST_SWITCH", int) is None
    monkeypatch.setenv("STATOR_TEST_SWITCH", " 7 ")
    assert switches.parsed("STATOR_TEST_SWITCH", int) == 7
    monkeypatch.setenv("STATOR_TEST_SWITCH", "seven")
    with pytest.raises(ValueError, match=r"^STATOR_TEST_SWITCH: invalid literal"):
        switches.parsed("STATOR_TEST_SWITCH", int)


@pytest.mark.parametrize(
    ("module", "env", "message"),
    [
        (
            "kernels.decode_attention",
            {"STATOR_DECODE_PROGRAMS_PER_SM": "many"},
            "STATOR_DECODE_PROGRAMS_PER_SM must be a positive integer, not 'many'",
        ),
        (
            "kernels.decode_attention",
            {"STATOR_DECODE_TILE": "64,4"},
            "STATOR_DECODE_TILE: a decode tile is BLOCK_N,WARPS,STAGES,PREFETCH (e.g. 64,4,2,0),"
            " not '64,4'",
        ),
        (
            "kernels.decode_attention",
            {"STATOR_DECODE_MIN_SPLITS": "0"},
            "STATOR_DECODE_MIN_SPLITS must be a positive integer, not '0'",
        ),
        (
            "kernels.pdl",
            {"STATOR_PDL": "yes please"},
            "STATOR_PDL must be 1 or 0 (true/false, on/off), not 'yes please'",
        ),
        ("epilogues", {"STATOR_FUSED_EPILOGUES": "2"}, "STATOR_FUSED_EPILOGUES must be 1 or 0"),
        (
            "kernels.fused_moe",
            {"STATOR_MXFP4_GEMM": "fast"},
            "STATOR_MXFP4_GEMM must be one of bytes, words, scaled, bits, not 'fast'",
        ),
    ],
)
def test_a_bad_switch_stops_the_import_with_its_name(module, env, message):
    code = f"import stator.engines.native.{module}"
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert message in proc.stderr


def test_the_kernels_read_their_switches():
    from stator.engines.native.kernels import decode_attention, fused_moe

    assert (
        int(os.environ.get("STATOR_DECODE_PROGRAMS_PER_SM", "16"))
        == decode_attention.PROGRAMS_PER_SM
    )
    assert (os.environ.get("STATOR_MXFP4_GEMM") or None) == fused_moe.MXFP4_GEMM
    forced = os.environ.get("STATOR_DECODE_TILE")
    assert (decode_attention.DecodeTile.parse(forced) if forced else None) == decode_attention.TILE
