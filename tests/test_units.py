"""Every number shown to a person: one formatter per unit, shares rounded down."""

import subprocess
import sys

import pytest

from lightning_perf import units
from purity import ROOT


@pytest.mark.parametrize(
    ("fraction", "text"),
    [
        (0.629, "62%"),
        (0.996, "99%"),  # not all of it
        (0.3, "30%"),
        (0.1 + 0.2, "30%"),  # 0.30000000000000004
        (0.29999999999999993, "30%"),  # 0.3 computed a hair below: a share at a 30% threshold shows as 30%
        (0.2999, "29%"),
        (0.0, "0%"),
        (1.0, "100%"),
    ],
)
def test_a_share_is_a_whole_percentage_rounded_down(fraction, text):
    assert units.percent(fraction) == text


def test_a_share_with_a_decimal_is_rounded_down_too():
    assert [units.percent(x, 1) for x in (0.2346, 0.42, 0.99999, 0.0004)] == ["23.4%", "42.0%", "99.9%", "0.0%"]


def test_thresholds_and_changes():
    assert [units.limit(x) for x in (0.1, 0.125, 0.3)] == ["10%", "12.5%", "30%"]
    assert [units.change(x) for x in (-0.1234, 0.5, 0.0)] == ["-12.3%", "+50.0%", "+0.0%"]
    assert units.change(0.1234, signed=False) == "12.3%"
    assert [units.times(x) for x in (2.468, 1.5, 1.19999999999)] == ["2.46x", "1.50x", "1.20x"]


def test_durations():
    assert (units.ms(0.01234), units.us(4.2e-6), units.seconds(1.234)) == ("12.34 ms", "4.2 us", "1.23 s")
    assert [units.seconds_or_ms(x) for x in (0.25, 0.1, 0.0999)] == ["0.25 s", "0.10 s", "99.90 ms"]
    assert [units.duration_us(x) for x in (812, 3420, 1_200_000)] == ["812 us", "3.42 ms", "1.20 s"]
    assert [units.duration(x) for x in (0.0412, 1.5, 0.000_45, 0.123_4, 0.005, 0)] == [
        "41.2 ms",
        "1.50 s",
        "450 µs",
        "123 ms",
        "5.00 ms",
        "0 ms",
    ]


def test_memory_and_counts():
    assert [units.size(x) for x in (100 * 2**20, 3 * 2**30 / 2)] == ["100 MiB", "1.5 GiB"]
    assert [units.mib(x) for x in (394 * 2**20, 2**31)] == ["394 MiB", "2,048 MiB"]
    sizes = [units.signed_size(x) for x in (512, -2048, 3 * 2**20, 2**42)]
    assert sizes == ["512 B", "-2.0 KiB", "3.0 MiB", "4096.0 GiB"]
    assert [units.count(x) for x in (5388.4, 12, 1e6)] == ["5,388", "12", "1,000,000"]
    assert [units.cpus(x) for x in (1.25, 0, 12)] == ["1.2 CPUs", "0.0 CPUs", "12.0 CPUs"]


def test_flops_and_rates_to_three_significant_digits():
    rates = [units.flops_rate(x) for x in (4.12e13, 8.12e11, 989e12, 1.5e15, 9.9949e12, 999.6e9, 0)]
    assert rates == [
        "41.2 TFLOP/s",
        "812 GFLOP/s",
        "989 TFLOP/s",
        "1.50 PFLOP/s",
        "9.99 TFLOP/s",
        "1.00 TFLOP/s",  # 999.6 G rounds up into the next prefix
        "0 FLOP/s",
    ]
    assert [units.flops(x) for x in (1.2e12, 3.4e9, 512.0)] == ["1.20 TFLOP", "3.40 GFLOP", "512 FLOP"]


def test_units_imports_nothing_of_the_package():
    # Every layer (diagnose, summarize, report, the command line) may use it: it must sit below them all.
    code = "import lightning_perf.units, sys\nprint(sorted(m for m in sys.modules if m.startswith('lightning_perf.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["['lightning_perf.units']"]


def test_plural_counts_a_noun():
    assert [units.plural(n, "recompile") for n in (0, 1, 2, 1500)] == [
        "0 recompiles",
        "1 recompile",
        "2 recompiles",
        "1,500 recompiles",
    ]
