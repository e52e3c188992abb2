"""Tests for workbench.front.option_types: argparse types that refuse, in one line, what the planners cannot use."""

from __future__ import annotations

import argparse
import math

import pytest

from workbench.front.option_types import (
    checked_by,
    finite_bandwidth,
    gpu_name,
    int_in,
    named,
    non_negative,
    positive_seconds,
)
from workbench.model.units import parse_size


def parse_error(type_fn, text: str, capsys) -> str:
    """The one line argparse prints when ``type_fn`` refuses ``text`` (it exits 2)."""
    ap = argparse.ArgumentParser(prog="prog")
    ap.add_argument("--x", type=type_fn)
    with pytest.raises(SystemExit) as e:
        ap.parse_args(["--x", text])
    assert e.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_int_in_accepts_exactly_the_closed_range():
    parse = int_in(2, 5)
    for text in ("2", "3", "5"):
        assert parse(text) == int(text)
    for bad in ("1", "6", "-3"):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^{bad} is not in 2\.\.5$"):
            parse(bad)


def test_int_in_without_upper_bound_and_not_a_number():
    parse = int_in(1)
    assert parse("1000000") == 1000000
    with pytest.raises(argparse.ArgumentTypeError, match=r"^0 is not in 1\.\.$"):
        parse("0")
    for bad in ("2.5", "two", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="is not a whole number"):
            parse(bad)


def test_positive_seconds_and_non_negative_differ_only_at_zero():
    assert positive_seconds("0.25") == 0.25
    assert non_negative("0") == 0.0
    with pytest.raises(argparse.ArgumentTypeError, match="^0 is not a positive finite number$"):
        positive_seconds("0")
    for bad in ("-1", "inf", "-inf", "nan", "1e400"):      # 1e400 overflows to inf
        with pytest.raises(argparse.ArgumentTypeError, match="finite number"):
            positive_seconds(bad)
        with pytest.raises(argparse.ArgumentTypeError, match="non-negative finite number"):
            non_negative(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="^'ten' is not a number$"):
        non_negative("ten")


def test_finite_bandwidth_units_and_infinity():
    assert finite_bandwidth("12GB/s") == 12e9
    assert finite_bandwidth("16GiB/s") == 16 * 2**30
    assert finite_bandwidth("1e10") == 1e10
    with pytest.raises(ValueError, match=r"^link: inf is not finite") as e:
        finite_bandwidth("inf", what="link")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="must be positive"):
        finite_bandwidth("0GB/s")


def test_names_refuse_blank_text():
    assert named("profile name")("resnet50") == "resnet50"
    with pytest.raises(argparse.ArgumentTypeError, match="^an empty profile name$"):
        named("profile name")("  ")
    assert gpu_name("  h100 ") == "h100"
    with pytest.raises(argparse.ArgumentTypeError, match="profile --list-gpus"):
        gpu_name("")


def test_checked_by_keeps_the_text_and_strips_the_placeholder_name():
    check = checked_by(finite_bandwidth)
    assert check("12GB/s") == "12GB/s"          # Platform parses it later: the text is kept as given
    with pytest.raises(argparse.ArgumentTypeError) as e:
        check("inf")
    assert str(e.value).startswith("inf is not finite")      # "value: " removed
    with pytest.raises(argparse.ArgumentTypeError) as e:
        checked_by(parse_size)("12 apples")
    assert not str(e.value).startswith("value")
    assert "12 apples" in str(e.value)


def test_argparse_prints_one_line_naming_the_option(capsys):
    assert parse_error(int_in(1, 8), "9", capsys) == "prog: error: argument --x: 9 is not in 1..8"
    line = parse_error(checked_by(finite_bandwidth), "inf", capsys)
    assert line.startswith("prog: error: argument --x: inf is not finite")
    line = parse_error(positive_seconds, "nan", capsys)
    assert line == "prog: error: argument --x: nan is not a positive finite number"


def test_accepted_values_round_trip_through_argparse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int_in(1, 64))
    ap.add_argument("--latency", type=non_negative)
    ap.add_argument("--bandwidth", type=checked_by(finite_bandwidth))
    args = ap.parse_args(["--devices", "64", "--latency", "1e-6", "--bandwidth", "3GB/s"])
    assert (args.devices, args.bandwidth) == (64, "3GB/s")
    assert math.isclose(args.latency, 1e-6)
