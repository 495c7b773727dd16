"""The peak table: the names devices really report, their dense peaks, and the run's dtype from its precision."""

import contextlib
import re

import pytest

import lightning_perf
from lightning_perf.peak_table import DTYPES, TABLE, device_peaks, dtype_for, normalized, peak_flops
from purity import heavy_modules_loaded_by

T = 1e12

# (what torch.cuda.get_device_name() returns, the entry it selects, dtype, dense TFLOP/s)
REPORTED = [
    ("NVIDIA H200", "H200 SXM", "bfloat16", 989.5),
    ("NVIDIA H200", "H200 SXM", "float8", 1979),
    ("NVIDIA H200", "H200 SXM", "float32", 67),
    ("NVIDIA H200 NVL", "H200 NVL", "bfloat16", 835.5),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", "bfloat16", 989.5),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", "tf32", 494.5),
    ("NVIDIA H100 PCIe", "H100 PCIe", "float16", 756.5),
    ("NVIDIA H100 PCIe", "H100 PCIe", "float8", 1513),
    ("NVIDIA H100 NVL", "H100 NVL", "bfloat16", 835.5),
    ("NVIDIA GH200 480GB", "GH200 (the Hopper GPU of a Grace Hopper superchip)", "bfloat16", 989.5),
    ("NVIDIA A100-SXM4-80GB", "A100 (PCIe and SXM4, 40 GB and 80 GB: the same peaks)", "bfloat16", 312),
    ("NVIDIA A100-SXM4-40GB", "A100 (PCIe and SXM4, 40 GB and 80 GB: the same peaks)", "tf32", 156),
    ("NVIDIA A100-PCIE-40GB", "A100 (PCIe and SXM4, 40 GB and 80 GB: the same peaks)", "float16", 312),
    ("NVIDIA A100 80GB PCIe", "A100 (PCIe and SXM4, 40 GB and 80 GB: the same peaks)", "float32", 19.5),
    ("Tesla V100-SXM2-16GB", "V100 SXM2 (16 GB and 32 GB)", "float16", 125),
    ("Tesla V100-SXM2-32GB", "V100 SXM2 (16 GB and 32 GB)", "float32", 15.7),
    ("Tesla V100-PCIE-32GB", "V100 PCIe (16 GB and 32 GB)", "float16", 112),
    ("Tesla V100-PCIE-16GB", "V100 PCIe (16 GB and 32 GB)", "float32", 14),
    ("Tesla V100S-PCIE-32GB", "V100S PCIe", "float16", 130),
    ("Tesla T4", "T4", "float16", 65),
    ("Tesla T4", "T4", "float32", 8.1),
    ("NVIDIA A10", "A10", "bfloat16", 125),
    ("NVIDIA A10G", "A10G", "bfloat16", 70),
    ("NVIDIA L4", "L4", "bfloat16", 121),
    ("NVIDIA L4", "L4", "float8", 242.5),
    ("NVIDIA L40S", "L40S", "bfloat16", 362.05),
    ("NVIDIA L40S", "L40S", "float8", 733),
    ("NVIDIA L40", "L40", "bfloat16", 181.05),
    ("NVIDIA B200", "B200 (HGX B200)", "bfloat16", 2250),
    ("NVIDIA B200", "B200 (HGX B200)", "float8", 4500),
    ("NVIDIA GB200", "GB200 (one Blackwell GPU of a Grace Blackwell superchip)", "bfloat16", 2500),
    ("AMD Instinct MI300X", "MI300X", "bfloat16", 1307.4),
    ("AMD Instinct MI300X", "MI300X", "float8", 2614.9),
    ("AMD Instinct MI250X", "MI250X (one of its two GCDs)", "bfloat16", 191.5),
    ("AMD Instinct MI250X/MI250", "MI250X (one of its two GCDs)", "float16", 191.5),
    ("AMD Instinct MI250", "MI250 (one of its two GCDs)", "bfloat16", 181.05),
]


@pytest.mark.parametrize(("reported", "entry", "dtype", "tflops"), REPORTED)
def test_a_reported_name_selects_its_entry_and_dense_peak(reported, entry, dtype, tflops):
    found = device_peaks(reported)
    assert found is not None and found.name == entry
    assert peak_flops(reported, dtype) == pytest.approx(tflops * T)


@pytest.mark.parametrize(
    ("reported", "same_as"),
    [
        ("nvidia h200", "NVIDIA H200"),  # any case
        ("  NVIDIA   H100\tNVL ", "NVIDIA H100 NVL"),  # any whitespace
        ("NVIDIA H100 SXM5 80GB", "NVIDIA H100 80GB HBM3"),
        ("NVIDIA H100 80GB HBM2e", "NVIDIA H100 PCIe"),
    ],
)
def test_names_are_matched_whatever_their_case_and_spacing(reported, same_as):
    assert device_peaks(reported) == device_peaks(same_as) is not None


@pytest.mark.parametrize(
    "reported",
    [
        "cpu",
        "",
        "NVIDIA GeForce RTX 4090",
        "NVIDIA RTX A1000",  # not an A10
        "NVIDIA A40",
        "NVIDIA RTX A6000",
        "NVIDIA H100",  # neither SXM, PCIe nor NVL said
        "Tesla V100-SXM3-32GB",  # the DGX-2's, clocked higher than the SXM2's
        "AMD Instinct MI300A",
        "AMD Instinct MI325X",
    ],
)
def test_a_name_the_table_does_not_know_has_no_peak(reported):
    assert device_peaks(reported) is None
    assert all(peak_flops(reported, dtype) is None for dtype in DTYPES)


@pytest.mark.parametrize(
    ("reported", "dtype"),
    [
        ("Tesla V100-SXM2-16GB", "bfloat16"),
        ("Tesla V100-SXM2-16GB", "float8"),
        ("Tesla T4", "bfloat16"),
        ("NVIDIA A100-SXM4-80GB", "float8"),
        ("NVIDIA A10G", "float8"),
        ("AMD Instinct MI250X", "float8"),
    ],
)
def test_a_dtype_the_device_has_no_unit_for_has_no_peak(reported, dtype):
    assert peak_flops(reported, dtype) is None


@pytest.mark.parametrize("reported", ["Tesla V100-SXM2-16GB", "Tesla T4", "AMD Instinct MI250X"])
def test_tf32_on_a_device_without_it_is_float32(reported):
    # What set_float32_matmul_precision("high") allows there: float32 matmuls, at the float32 peak.
    assert peak_flops(reported, "tf32") == peak_flops(reported, "float32") is not None


@pytest.mark.parametrize("dtype", ["fp16", "float64", "half", "TF32", None, 16])
def test_a_dtype_outside_the_table_is_an_error_that_names_the_choices(dtype):
    allowed = "one of ['float32', 'tf32', 'bfloat16', 'float16', 'float8']"
    with pytest.raises(ValueError, match=re.escape(f"dtype must be {allowed}, got {dtype!r}")):
        peak_flops("NVIDIA H200", dtype)


def test_the_table_is_dense_and_sourced():
    for entry in TABLE:
        rates = entry.tflops
        assert entry.source and re.search(r"\(20\d\d\)", entry.source), entry.name
        assert rates.float32 > 0 and rates.float16 > rates.float32, entry.name
        assert rates.bfloat16 in (None, rates.float16), entry.name
        # Each tensor-core rate about twice the next wider one's: a sparse figure among dense ones (or a dense
        # one among sparse ones) would break the pattern.
        if rates.float8 is not None:
            assert rates.float8 == pytest.approx(2 * rates.float16, rel=0.05), entry.name
        if rates.tf32 is not None:
            assert rates.float16 / rates.tf32 == pytest.approx(2, rel=0.05), entry.name
        assert entry.patterns and all(p == normalized(p) for p in entry.patterns), entry.name


def test_every_entry_is_reachable_by_a_name():
    # No entry shadowed by an earlier one: each entry is the first match of some reported name above.
    selected = {device_peaks(reported) for reported, *_ in REPORTED}
    assert set(TABLE) <= selected


@pytest.mark.parametrize(
    ("precision", "matmul", "dtype"),
    [
        ("bf16-mixed", "highest", "bfloat16"),
        ("bf16-true", "high", "bfloat16"),
        ("bf16", "highest", "bfloat16"),
        ("16-mixed", "highest", "float16"),
        ("16-true", "medium", "float16"),
        ("16", "highest", "float16"),
        (16, "highest", "float16"),
        ("transformer-engine", "highest", "float8"),
        ("transformer-engine-float16", "highest", "float8"),
        ("32-true", "highest", "float32"),
        ("32-true", "high", "tf32"),
        ("32-true", "medium", "tf32"),
        ("32", "highest", "float32"),
        (None, "highest", "float32"),
        (None, "high", "tf32"),
        ("64-true", "highest", None),  # the table has no float64 figures
        ("64-true", "high", None),
        ("64", "highest", None),
    ],
)
def test_the_dtype_follows_the_run_precision(precision, matmul, dtype):
    assert dtype_for(precision, matmul) == dtype
    if dtype is not None:
        assert peak_flops("NVIDIA H200", dtype) is not None


def test_a_32_bit_run_is_float32_by_default():
    assert dtype_for("32-true") == "float32"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("bf16-mixd",), "precision must be one of ['bf16-mixed', "),
        ((True,), "precision must be one of ['bf16-mixed', "),
        (("32-true", "low"), "float32_matmul_precision must be one of ['highest', 'high', 'medium'], got 'low'"),
    ],
)
def test_a_precision_lightning_does_not_have_is_an_error(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        dtype_for(*args)


def test_the_package_exports_the_function():
    from lightning_perf import peak_flops as exported

    assert exported is peak_flops
    assert lightning_perf.peak_flops is peak_flops
    assert exported("NVIDIA H200", "bfloat16") == pytest.approx(989.5 * T)
    assert "peak_flops" in lightning_perf.__all__


def test_the_table_imports_neither_torch_nor_lightning():
    assert heavy_modules_loaded_by("lightning_perf.peak_table") == []


@pytest.mark.parametrize(
    ("reported", "lightnings", "ours"),
    [
        ("NVIDIA H200", None, 989.5 * T),  # it matches "h200 sxm1", which no device reports
        ("NVIDIA H200 NVL", None, 835.5 * T),  # "h200 nvl1"
        ("NVIDIA H100 NVL", 1978.8 * T, 835.5 * T),  # a sparse figure (of an H100 SXM)
        ("NVIDIA L40S", 121 * T, 362.05 * T),  # read as an L4
        ("NVIDIA B200", None, 2250 * T),
        ("AMD Instinct MI300X", None, 1307.4 * T),
    ],
)
def test_lightnings_table_is_not_what_we_rely_on(monkeypatch, reported, lightnings, ours):
    torch = pytest.importorskip("torch")
    from lightning.fabric.utilities import throughput

    # Lightning reads the name through torch.cuda.get_device_name(device): give it the name a real device reports.
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: reported)
    unknown = pytest.warns(UserWarning, match="FLOPs not found")
    with unknown if lightnings is None else contextlib.nullcontext():
        found = throughput.get_available_flops(torch.device("cuda"), torch.bfloat16)
    assert found == (None if lightnings is None else pytest.approx(lightnings))
    assert peak_flops(reported, "bfloat16") == pytest.approx(ours)
