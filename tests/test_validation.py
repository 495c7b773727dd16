"""One way to check a value a person gave: kinds declared once, one message format for a bad value."""

import dataclasses
import subprocess
import sys

import pytest

from lightning_perf import validation as v
from purity import ROOT


@pytest.mark.parametrize(
    ("kind", "value", "message"),
    [
        (v.INTEGER, "3", "x must be an integer, got '3' (string)"),
        (v.INTEGER, True, "x must be an integer, got True (boolean)"),
        (v.integer(1), 0, "x must be an integer >= 1, got 0 (integer)"),
        (v.integer(0), 1.0, "x must be an integer >= 0, got 1.0 (number)"),
        (v.NUMBER.or_none("null"), [1], "x must be a number or null, got [1] (array)"),
        (v.one_of(v.NUMBER, v.STRING), {}, "x must be a number or a string, got {} (object)"),
        (v.FRACTION, float("nan"), "x must be a fraction between 0 and 1, got nan (number)"),
        (v.BOOLEAN.said("True or False"), None, "x must be True or False, got None (null)"),
        (v.choice(("a", "b")), "c", "x must be one of ['a', 'b'], got 'c' (string)"),
        (v.number(above=0).said("a number of MB > 0"), 0, "x must be a number of MB > 0, got 0 (integer)"),
        (v.PATH, (1,), "x must be a path, got (1,) (tuple)"),  # not a JSON type: Python's name
    ],
)
def test_a_bad_value_names_the_parameter_the_value_and_what_is_allowed(kind, value, message):
    assert kind.problem("x", value) == message


@pytest.mark.parametrize(
    ("kind", "good"),
    [
        (v.INTEGER, [0, -3, 2**70]),
        (v.integer(1), [1, 5]),
        (v.COUNT, [1, 3, 3.0]),  # a YAML or JSON file may give 3.0
        (v.BYTES, [0, 2**40, 1024.0]),
        (v.FRACTION, [0, 0.5, 1]),
        (v.RATIO, [1, 1.5]),
        (v.SECONDS, [0, 1e-6]),
        (v.NUMBER.or_none(), [None, 1, 2.5]),
        (v.choice(("a", "b")), ["a"]),
        (v.INDICES, [[], [0, 3], (1, 2)]),
    ],
)
def test_good_values_pass(kind, good):
    assert [kind.problem("x", value) for value in good] == [None] * len(good)


@pytest.mark.parametrize(
    ("kind", "bad"),
    [
        (v.COUNT, [0, 2.5, True, float("inf"), "3"]),
        (v.BYTES, [-1, 0.5, float("nan")]),
        (v.FRACTION, [-0.1, 1.5, True, float("inf")]),
        (v.RATIO, [0.9, float("nan")]),
        (v.SECONDS, [-1e-6, "1", float("inf")]),
        (v.INDICES, ["01", [0, -1], [True], 3]),
        (v.choice(("a", "b")), [["a"], None]),
    ],
)
def test_bad_values_fail(kind, bad):
    assert all(kind.problem("x", value) is not None for value in bad)


def test_a_long_value_is_cut_to_sixty_characters():
    text = v.shown("x" * 1000)
    assert text == "'" + "x" * 56 + "... (string)" and len(text.removesuffix(" (string)")) == v.SHOWN_CHARS


@dataclasses.dataclass(frozen=True)
class _Window:
    active: int = v.declared(v.integer(1), 3)
    share: float = v.declared(v.FRACTION, 0.5)
    label: str = "unchecked"


def test_declared_fields_are_checked_by_name():
    assert v.field_problems(_Window, {"active": 0, "share": 2, "label": 3}, prefix="w.") == [
        "w.active must be an integer >= 1, got 0 (integer)",
        "w.share must be a fraction between 0 and 1, got 2 (integer)",
    ]
    assert v.field_problems(_Window, {"active": 0, "share": 2}, only={"share"}) == [
        "share must be a fraction between 0 and 1, got 2 (integer)"
    ]
    assert v.field_problems(_Window, {}) == []
    assert _Window() == _Window(active=3, share=0.5)


def test_all_problems_in_one_message():
    assert v.problems_message("Owner", ["a", "b"]) == "Owner got invalid arguments:\n  - a\n  - b"


def test_validation_imports_nothing_of_the_package():
    code = (
        "import lightning_perf.validation, sys\n"
        "print(sorted(m for m in sys.modules if m.startswith('lightning_perf.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["['lightning_perf.validation']"]
