from __future__ import annotations

import pytest

from helpers import tiny_trace
from memsched.errors import MemschedError
from memsched.optimizer.budget import budget_between, keepall_activation_peak, min_feasible_budget, resolve_budget
from memsched.units import format_bytes, parse_budget, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12GiB", 12 * 2**30),
        ("500MB", 500 * 10**6),
        ("1048576", 2**20),
        ("1.5 GiB", 3 * 2**29),
        (" 2kib ", 2048),
        (4096, 4096),
        ("1e9", 10**9),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "12 parsecs", "-5", "0", "0GiB", "abc", "5XB"])
def test_parse_bytes_rejects(text):
    with pytest.raises(MemschedError, match="budget"):
        parse_bytes(text)


def test_percent_budget_is_static_plus_share_of_activations():
    tr = tiny_trace([1, 1], [1, 1], [100, 300], static=1000)
    act = keepall_activation_peak(tr)
    assert act == 400
    assert resolve_budget("50%", tr) == 1000 + 200
    assert resolve_budget("100%", tr) == 1000 + 400
    assert resolve_budget(parse_budget("2GiB"), tr) == 2 * 2**30


@pytest.mark.parametrize("text", ["0%", "-3%", "x%", "nan%"])
def test_percent_rejects(text):
    with pytest.raises(MemschedError, match="budget"):
        parse_budget(text)


def test_format_bytes():
    assert format_bytes(3 * 2**30) == "3.00 GiB"
    assert format_bytes(512) == "512 B"


def test_budget_between_spans_minimum_to_keep_all() -> None:
    trace = tiny_trace([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [100, 200, 300], static=50)
    lo = min_feasible_budget(trace)
    hi = trace.static.total + keepall_activation_peak(trace)
    assert lo < hi
    assert budget_between(trace, 0.0) == lo and budget_between(trace, 1.0) == hi
    assert lo < budget_between(trace, 0.5) < hi
    with pytest.raises(ValueError, match=r"frac must be in \[0, 1\]"):
        budget_between(trace, 1.5)


@pytest.mark.parametrize("text", ["1e400", "1e31", "9.3e18", "9000000TiB"])
def test_parse_bytes_too_large_is_a_user_error(text):
    with pytest.raises(MemschedError, match=r"larger than any memory \(at most 8 EiB"):
        parse_bytes(text)


def test_parse_bytes_largest_accepted():
    assert parse_bytes("9.2e18") == 9_200_000_000_000_000_000
    assert parse_bytes(str(2**63 - 1)) == 2**63 - 1


@pytest.mark.parametrize(("text", "pct"), [("0.5", "50%"), (".25", "25%"), ("1", "100%"), ("0.05", "5%")])
def test_budget_fraction_suggests_a_percentage(text, pct):
    with pytest.raises(MemschedError, match=f"did you mean {pct}\\?"):
        parse_budget(text)


def test_budget_above_one_byte_is_bytes():
    assert parse_budget("2").bytes == 2 and parse_budget("1.5e9").bytes == 1_500_000_000
