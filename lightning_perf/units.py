"""
Units
=====

Every number shown to a person (the console, the command line, TensorBoard's text, the findings' evidence,
the operator tables, the chart captions) is formatted here, one formatter per unit and use:

- shares: whole percentages **rounded down** (:func:`percent`), so that a share shown as "30%" has reached
  a 30% threshold, and a share of 99.6% is not shown as all of it; a threshold as it was set
  (:func:`limit`); a relative change between two runs (:func:`change`), rounded to one decimal;
- ratios: two decimals rounded down (:func:`times`);
- durations, from seconds: of a step in ms with two decimals (:func:`ms`), of an operator or a kernel in us
  with one (:func:`us`), in a caption to about three significant digits in the unit that reads best
  (:func:`duration`); from the microseconds of Kineto's operator statistics, in a table (:func:`duration_us`);
- memory: in evidence, MiB or GiB (:func:`size`); in a table column, whole MiB (:func:`mib`); an operator's
  memory, signed (freed memory is negative), in the largest unit that keeps the number >= 1
  (:func:`signed_size`);
- counts: whole, with thousands separators (:func:`count`);
- floating-point work: a count of FLOPs (:func:`flops`) and a rate (:func:`flops_rate`), to three significant
  digits with the SI prefix that keeps the number >= 1.

Pure: imports nothing from torch, Lightning or the rest of this package, so that every layer can use it.
"""

from __future__ import annotations

import math

TOLERANCE = 1e-9
"""A measured share equal to its threshold counts as reaching it even when floating point puts it a hair
below (0.3 computed as 0.29999999999999993); a share is rounded down with the same tolerance."""

MIB = 2**20
GIB = 2**30


def _round_down(value: float, decimals: int) -> float:
    """``value`` rounded down to ``decimals`` decimals, within :data:`TOLERANCE` of the next one up."""
    scale = 10**decimals
    return math.floor(value * scale + TOLERANCE * scale) / scale


# --- Shares and ratios ---------------------------------------------------------------------------------------


def percent(fraction: float, decimals: int = 0) -> str:
    """A measured share as a percentage rounded down: ``0.629`` -> ``"62%"``, ``0.996`` -> ``"99%"``;
    ``percent(0.2346, 1)`` -> ``"23.4%"``."""
    return f"{_round_down(fraction, decimals + 2) * 100:.{decimals}f}%"


def limit(fraction: float) -> str:
    """A threshold share as set: ``0.1`` -> ``"10%"``, ``0.125`` -> ``"12.5%"``."""
    return f"{round(fraction * 100, 6):g}%"


def change(ratio: float, *, signed: bool = True) -> str:
    """A relative change, ``after / before - 1``: ``-0.1234`` -> ``"-12.3%"`` (``signed=False``: ``"12.3%"``)."""
    return f"{ratio:+.1%}" if signed else f"{ratio:.1%}"


def points(delta: float) -> str:
    """A change of a share in percentage points, one decimal: ``0.0104`` (12% -> 13.04%) -> ``"+1.0 pp"``."""
    return f"{delta * 100:+.1f} pp"


def times(ratio: float) -> str:
    """A measured ratio, rounded down to two decimals: ``2.468`` -> ``"2.46x"``."""
    return f"{_round_down(ratio, 2):.2f}x"


# --- Durations -----------------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    """A step-level time: ``0.01234`` -> ``"12.34 ms"``."""
    return f"{seconds * 1e3:.2f} ms"


def seconds(value: float) -> str:
    """An epoch-level time: ``1.234`` -> ``"1.23 s"``."""
    return f"{value:.2f} s"


def seconds_or_ms(value: float) -> str:
    """A time that may be an epoch's or a step's: :func:`seconds` from 0.1 s up, else :func:`ms`."""
    return seconds(value) if value >= 0.1 else ms(value)


def us(seconds: float) -> str:
    """An operator- or kernel-level time: ``4.2e-6`` -> ``"4.2 us"``."""
    return f"{seconds * 1e6:.1f} us"


def duration(seconds: float) -> str:
    """``seconds`` in the unit that reads best, to about three significant digits: ``"41.2 ms"``,
    ``"1.50 s"``, ``"450 µs"``."""
    if seconds == 0:
        return "0 ms"
    for unit, factor in (("s", 1.0), ("ms", 1e3), ("µs", 1e6)):
        value = seconds * factor
        if value >= 0.9995 or unit == "µs":
            break
    if value >= 99.95:
        return f"{value:.0f} {unit}"
    return f"{value:.1f} {unit}" if value >= 9.995 else f"{value:.2f} {unit}"


def duration_us(microseconds: float) -> str:
    """Microseconds (Kineto's unit) as a short human string: ``812 us``, ``3.42 ms``, ``1.20 s``."""
    if microseconds < 1_000:
        return f"{microseconds:.0f} us"
    if microseconds < 1_000_000:
        return f"{microseconds / 1_000:.2f} ms"
    return f"{microseconds / 1_000_000:.2f} s"


# --- Memory --------------------------------------------------------------------------------------------------


def size(nbytes: float) -> str:
    """Memory in evidence: MiB below 1 GiB, else GiB with one decimal."""
    if abs(nbytes) >= GIB:
        return f"{nbytes / GIB:.1f} GiB"
    return f"{nbytes / MIB:.0f} MiB"


def mib(nbytes: float) -> str:
    """Memory in a table column: whole MiB, ``"1,234 MiB"``."""
    return f"{nbytes / MIB:,.0f} MiB"


def signed_size(nbytes: int) -> str:
    """Bytes, signed (memory freed is negative), in the largest unit that keeps the number >= 1."""
    sign = "-" if nbytes < 0 else ""
    value = float(abs(nbytes))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


# --- Counts --------------------------------------------------------------------------------------------------


def count(value: float) -> str:
    """A count or a rate, whole, with thousands separators: ``5388.4`` -> ``"5,388"``."""
    return f"{value:,.0f}"


def plural(n: int, noun: str) -> str:
    """A count of a noun, the noun in the plural unless the count is one: ``"3 recompiles"``, ``"1 CPU"``."""
    return f"{count(n)} {noun}{'' if n == 1 else 's'}"


def cpus(value: float) -> str:
    """CPUs' worth of CPU time over wall time, one decimal: ``1.25`` -> ``"1.2 CPUs"``."""
    return f"{value:.1f} CPUs"


# --- Arithmetic ----------------------------------------------------------------------------------------------

_SI_PREFIXES = ("", "k", "M", "G", "T", "P", "E")


def si_scale(value: float) -> tuple[str, float]:
    """The SI prefix (``""``, ``"k"``, ..., ``"E"``) and its factor that show ``value`` between 1 and 1000 at
    three significant digits (999.6 shows as 1.00 k, not 1000): also the unit of a chart's axis whose largest
    value is ``value``."""
    prefix, factor = 0, 1.0
    while abs(value) >= 999.5 * factor and prefix < len(_SI_PREFIXES) - 1:
        prefix, factor = prefix + 1, factor * 1000
    return _SI_PREFIXES[prefix], factor


def _three_digits(value: float, unit: str) -> str:
    """``value`` to three significant digits, with the SI prefix that keeps it between 1 and 1000."""
    if value == 0:
        return f"0 {unit}"
    prefix, factor = si_scale(value)
    scaled = value / factor
    digits = 0 if abs(scaled) >= 99.95 else 1 if abs(scaled) >= 9.995 else 2
    return f"{scaled:.{digits}f} {prefix}{unit}"


def flops(value: float) -> str:
    """An amount of arithmetic: ``8.12e11`` -> ``"812 GFLOP"``, ``1.5e12`` -> ``"1.50 TFLOP"``."""
    return _three_digits(value, "FLOP")


def flops_rate(value: float) -> str:
    """An arithmetic rate: ``4.12e13`` -> ``"41.2 TFLOP/s"``, ``8.12e11`` -> ``"812 GFLOP/s"``."""
    return _three_digits(value, "FLOP/s")


def bandwidth(value: float) -> str:
    """A data rate in SI units, as nccl-tests reports them: ``6.56e9`` -> ``"6.56 GB/s"``."""
    return _three_digits(value, "B/s")
