"""
Peak table
==========

The dense peak FLOP/s of the accelerators people train on, per dtype, each figure from its vendor's datasheet,
and the names the devices report (``torch.cuda.get_device_name()``) that select them: the denominator of MFU.

Notes:
    1. **Dense**. Datasheets print tensor-core figures "with sparsity" (2:4 structured sparsity, which dense
       training never uses) beside, or instead of, the dense ones. Where an entry says so, its datasheet gave
       only the sparse figure and the entry halves it (``1979 / 2``): the dense rate is half the sparse one.
    2. **Per device**, as torch counts devices: one GPU of a GB200 superchip (the superchip holds two), one GCD of
       an MI250X (ROCm shows its two GCDs as two devices, so half the module's figure); an MI300X in its default
       (SPX) partition mode is one device.
    3. **float32** is the matrix figure where the device has one for FP32 (AMD's "FP32 Matrix"), else the
       non-tensor FP32 one. **tf32** means float32 matmuls that may use TF32 (what
       ``torch.set_float32_matmul_precision("high")`` allows); a device without TF32 runs them in float32, so
       its float32 figure is returned. **float16** is FP16 with FP32 accumulation, as PyTorch's matmuls use.
    4. **Names** are matched case-insensitively, with runs of whitespace read as one space, against each entry's
       patterns in table order; the first entry with a matching pattern wins. Patterns are regular expressions
       anchored on word boundaries, so that ``a10`` does not match "A100" or "RTX A1000", nor ``h200`` "GH200";
       entries whose patterns overlap are still ordered most specific first (H100 NVL before H100, A10G before
       A10, L40S before L40). A name no entry matches gives ``None``: a guess would give a wrong MFU.

Pure: imports nothing from torch or Lightning; the caller passes the device's name and the run's dtype
(:func:`dtype_for` turns the Trainer's precision into one).

Example::

    peak_flops("NVIDIA H100 80GB HBM3", "bfloat16")  # 989.5e12
    peak_flops("NVIDIA GeForce RTX 4090", "bfloat16")  # None: not in the table
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lightning_perf.validation import bad_value, choice

DTYPES = ("float32", "tf32", "bfloat16", "float16", "float8")
"""The dtypes of the table, as :func:`peak_flops` takes them."""
MATMUL_PRECISIONS = ("highest", "high", "medium")
"""What ``torch.get_float32_matmul_precision()`` returns."""
_TERA = 1e12


@dataclass(frozen=True)
class PeakTflops:
    """A device's dense peak rates, in TFLOP/s, per dtype of :data:`DTYPES`; ``None`` where it has no unit for
    that dtype (TF32 and bf16 before Ampere, FP8 before Hopper and Ada)."""

    float32: float
    float16: float
    tf32: float | None = None
    bfloat16: float | None = None
    float8: float | None = None


@dataclass(frozen=True)
class DevicePeaks:
    """One device of the table.

    Attributes:
        name: The device, as its datasheet names it.
        patterns: Regular expressions, any of which selects this entry in a reported name (lower case, single
            spaces: :func:`normalized`).
        tflops: Its dense peak rates.
        source: The datasheet: title, year and address.
    """

    name: str
    patterns: tuple[str, ...]
    tflops: PeakTflops
    source: str

    def matches(self, normalized_name: str) -> bool:
        """Whether ``normalized_name`` (see :func:`normalized`) is this device's."""
        return any(re.search(pattern, normalized_name) for pattern in self.patterns)


_NVIDIA_H100 = "NVIDIA H100 Tensor Core GPU datasheet (2024), https://www.nvidia.com/en-us/data-center/h100/"
_NVIDIA_H200 = (
    "NVIDIA H200 Tensor Core GPU datasheet (2024), "
    "https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446"
)
_NVIDIA_V100 = (
    "NVIDIA Tesla V100 GPU Accelerator datasheet (2018), "
    "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
)
_AMD_MI200 = (
    "AMD Instinct MI200 series accelerators datasheet (2021), "
    "https://www.amd.com/system/files/documents/amd-instinct-mi200-datasheet.pdf"
)

# In table order: where two entries' patterns can both match a name, the more specific comes first.
TABLE: tuple[DevicePeaks, ...] = (
    # --- NVIDIA Blackwell. Tensor figures: "with sparsity" per GPU on the spec pages, halved. -------------------
    DevicePeaks(
        name="GB200 (one Blackwell GPU of a Grace Blackwell superchip)",
        patterns=(r"\bgb200\b",),
        tflops=PeakTflops(float32=80, tf32=2500 / 2, bfloat16=5000 / 2, float16=5000 / 2, float8=10000 / 2),
        source="NVIDIA GB200 NVL72 specifications, individual Blackwell GPU (2025), "
        "https://www.nvidia.com/en-us/data-center/gb200-nvl72/",
    ),
    DevicePeaks(
        name="B200 (HGX B200)",
        patterns=(r"\bb200\b",),
        tflops=PeakTflops(float32=75, tf32=2200 / 2, bfloat16=4500 / 2, float16=4500 / 2, float8=9000 / 2),
        source="NVIDIA HGX B200 specifications, individual Blackwell GPU (2025), "
        "https://www.nvidia.com/en-us/data-center/hgx/",
    ),
    # --- NVIDIA Hopper. Tensor figures: the datasheets give only "with sparsity" ones, halved. -----------------
    DevicePeaks(
        name="H200 NVL",
        patterns=(r"\bh200 nvl\b",),
        tflops=PeakTflops(float32=60, tf32=835 / 2, bfloat16=1671 / 2, float16=1671 / 2, float8=3341 / 2),
        source=_NVIDIA_H200,
    ),
    DevicePeaks(
        name="H200 SXM",  # reports itself as "NVIDIA H200"
        patterns=(r"\bh200\b",),
        tflops=PeakTflops(float32=67, tf32=989 / 2, bfloat16=1979 / 2, float16=1979 / 2, float8=3958 / 2),
        source=_NVIDIA_H200,
    ),
    DevicePeaks(
        name="GH200 (the Hopper GPU of a Grace Hopper superchip)",
        patterns=(r"\bgh200\b",),
        tflops=PeakTflops(float32=67, tf32=989 / 2, bfloat16=1979 / 2, float16=1979 / 2, float8=3958 / 2),
        source="NVIDIA GH200 Grace Hopper Superchip datasheet (2023), "
        "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/",
    ),
    DevicePeaks(
        name="H100 NVL",  # the 94 GB PCIe card; one device per card
        patterns=(r"\bh100 nvl\b",),
        tflops=PeakTflops(float32=60, tf32=835 / 2, bfloat16=1671 / 2, float16=1671 / 2, float8=3341 / 2),
        source=_NVIDIA_H100,
    ),
    DevicePeaks(
        name="H100 PCIe",
        patterns=(r"\bh100\b.*\b(pcie|hbm2e)\b",),
        tflops=PeakTflops(float32=51, tf32=756 / 2, bfloat16=1513 / 2, float16=1513 / 2, float8=3026 / 2),
        source=_NVIDIA_H100,
    ),
    DevicePeaks(
        name="H100 SXM",  # reports itself as "NVIDIA H100 80GB HBM3"
        patterns=(r"\bh100\b.*\b(hbm3|sxm\d?)\b",),
        tflops=PeakTflops(float32=67, tf32=989 / 2, bfloat16=1979 / 2, float16=1979 / 2, float8=3958 / 2),
        source=_NVIDIA_H100,
    ),
    # --- NVIDIA Ada. L40S and L40: dense figures as printed ("dense | sparse"). -----------------------------------
    DevicePeaks(
        name="L40S",
        patterns=(r"\bl40s\b",),
        tflops=PeakTflops(float32=91.6, tf32=183, bfloat16=362.05, float16=362.05, float8=733),
        source="NVIDIA L40S GPU datasheet (2023), https://www.nvidia.com/en-us/data-center/l40s/",
    ),
    DevicePeaks(
        name="L40",
        patterns=(r"\bl40\b",),
        tflops=PeakTflops(float32=90.5, tf32=90.5, bfloat16=181.05, float16=181.05, float8=362),
        source="NVIDIA L40 GPU datasheet (2022), https://www.nvidia.com/en-us/data-center/l40/",
    ),
    # L4: the datasheet gives only "with sparsity" tensor figures, halved.
    DevicePeaks(
        name="L4",
        patterns=(r"\bl4\b",),
        tflops=PeakTflops(float32=30.3, tf32=120 / 2, bfloat16=242 / 2, float16=242 / 2, float8=485 / 2),
        source="NVIDIA L4 Tensor Core GPU datasheet (2023), https://www.nvidia.com/en-us/data-center/l4/",
    ),
    # --- NVIDIA Ampere: dense figures as printed (the datasheets print "dense | sparse"). ----------------------
    DevicePeaks(
        name="A100 (PCIe and SXM4, 40 GB and 80 GB: the same peaks)",
        patterns=(r"\ba100\b",),
        tflops=PeakTflops(float32=19.5, tf32=156, bfloat16=312, float16=312),
        source="NVIDIA A100 Tensor Core GPU datasheet (2021), https://www.nvidia.com/content/dam/en-zz/Solutions/"
        "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
    ),
    DevicePeaks(
        # AWS's variant of the A10 (80 SMs, tensor cores at the GeForce rate for FP32 accumulation); NVIDIA
        # publishes no datasheet for it.
        name="A10G",
        patterns=(r"\ba10g\b",),
        tflops=PeakTflops(float32=35, tf32=35, bfloat16=70, float16=70),
        source="Baseten, NVIDIA A10 vs A10G for ML model inference (2023), "
        "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/",
    ),
    DevicePeaks(
        name="A10",
        patterns=(r"\ba10\b",),
        tflops=PeakTflops(float32=31.2, tf32=62.5, bfloat16=125, float16=125),
        source="NVIDIA A10 Tensor Core GPU datasheet (2021), "
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/a10-datasheet.pdf",
    ),
    # --- NVIDIA Turing and Volta: FP16 tensor cores only. ---------------------------------------------------------
    DevicePeaks(
        name="T4",
        patterns=(r"\bt4\b",),
        tflops=PeakTflops(float32=8.1, float16=65),
        source="NVIDIA T4 Tensor Core GPU datasheet (2019), https://www.nvidia.com/content/dam/en-zz/Solutions/"
        "Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
    ),
    DevicePeaks(
        name="V100S PCIe",
        patterns=(r"\bv100s[- ]pcie\b",),
        tflops=PeakTflops(float32=16.4, float16=130),
        source=_NVIDIA_V100,
    ),
    DevicePeaks(
        name="V100 SXM2 (16 GB and 32 GB)",  # not the SXM3 of the DGX-2, which clocks higher
        patterns=(r"\bv100[- ]sxm2\b",),
        tflops=PeakTflops(float32=15.7, float16=125),
        source=_NVIDIA_V100,
    ),
    DevicePeaks(
        name="V100 PCIe (16 GB and 32 GB)",
        patterns=(r"\bv100[- ]pcie\b",),
        tflops=PeakTflops(float32=14, float16=112),
        source=_NVIDIA_V100,
    ),
    # --- AMD CDNA: dense figures as printed. ------------------------------------------------------------------------
    DevicePeaks(
        name="MI300X",
        patterns=(r"\bmi300x\b",),
        tflops=PeakTflops(float32=163.4, tf32=653.7, bfloat16=1307.4, float16=1307.4, float8=2614.9),  # FP32 Matrix
        source="AMD Instinct MI300X accelerator datasheet (2023), https://www.amd.com/content/dam/amd/en/documents/"
        "instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf",
    ),
    DevicePeaks(
        # One GCD: half the module's figures. ROCm names it "AMD Instinct MI250X" or "AMD Instinct MI250X/MI250"
        # (the latter for an MI250 too, whose peaks are 5% lower: MFU reads low by as much there).
        name="MI250X (one of its two GCDs)",
        patterns=(r"\bmi250x\b",),
        tflops=PeakTflops(float32=95.7 / 2, bfloat16=383 / 2, float16=383 / 2),  # FP32 Matrix
        source=_AMD_MI200,
    ),
    DevicePeaks(
        name="MI250 (one of its two GCDs)",
        patterns=(r"\bmi250\b",),
        tflops=PeakTflops(float32=90.5 / 2, bfloat16=362.1 / 2, float16=362.1 / 2),  # FP32 Matrix
        source=_AMD_MI200,
    ),
)


def normalized(device_name: str) -> str:
    """``device_name`` as the patterns read it: lower case, runs of whitespace as one space, no outer spaces."""
    return " ".join(device_name.lower().split())


def device_peaks(device_name: str) -> DevicePeaks | None:
    """The table's entry for a device of that reported name, or ``None`` if the table does not know it."""
    name = normalized(device_name)
    return next((entry for entry in TABLE if entry.matches(name)), None)


def peak_flops(device_name: str, dtype: str) -> float | None:
    """The dense peak FLOP/s of one device of that name for matmuls in ``dtype``, or ``None`` if unknown.

    Args:
        device_name: What the device reports: ``torch.cuda.get_device_name()``, e.g. ``"NVIDIA H200"``.
        dtype: One of :data:`DTYPES`; :func:`dtype_for` gives the run's.

    Returns:
        FLOP/s (not TFLOP/s); ``None`` for a device the table does not know, or a dtype it has no unit for
        (``"bfloat16"`` on a V100).

    Raises:
        ValueError: If ``dtype`` is not one of :data:`DTYPES`.
    """
    problem = choice(DTYPES).problem("dtype", dtype)
    if problem is not None:
        raise ValueError(problem)
    entry = device_peaks(device_name)
    if entry is None:
        return None
    tflops: float | None = getattr(entry.tflops, dtype)
    if tflops is None and dtype == "tf32":  # no TF32 unit: float32 matmuls run in float32 (Notes, 3)
        tflops = entry.tflops.float32
    return None if tflops is None else tflops * _TERA


_PRECISION_DTYPES: dict[str, str | None] = {
    "bf16-mixed": "bfloat16",
    "bf16-true": "bfloat16",
    "bf16": "bfloat16",
    "16-mixed": "float16",
    "16-true": "float16",
    "16": "float16",
    "transformer-engine": "float8",
    "transformer-engine-float16": "float8",
    "32-true": "float32",
    "32": "float32",
    "64-true": None,  # the table has no float64 figures
    "64": None,
}
#: What ``Trainer(precision=...)`` accepts, as strings (``lightning-perf analyze --precision``).
LIGHTNING_PRECISIONS = tuple(_PRECISION_DTYPES)


def dtype_for(precision: str | int | None, float32_matmul_precision: str = "highest") -> str | None:
    """The dtype of the table that a run's matmuls use, from its Lightning precision.

    Args:
        precision: ``trainer.precision`` (``"bf16-mixed"``, ``"32-true"``...), or its short form (``"16"``,
            ``16``); ``None`` counts as ``"32-true"``.
        float32_matmul_precision: ``torch.get_float32_matmul_precision()``: with ``"high"`` or ``"medium"``,
            float32 matmuls may use TF32, so a 32-bit run's dtype is ``"tf32"``.

    Returns:
        One of :data:`DTYPES`, or ``None`` for a 64-bit run (the table has no float64 figures).

    Raises:
        ValueError: If ``precision`` is not one of Lightning's, or ``float32_matmul_precision`` is not one of
            :data:`MATMUL_PRECISIONS`.
    """
    key = "32-true" if precision is None else str(precision)
    if key not in _PRECISION_DTYPES or isinstance(precision, bool):
        raise ValueError(bad_value("precision", precision, f"one of {list(_PRECISION_DTYPES)} or None"))
    problem = choice(MATMUL_PRECISIONS).problem("float32_matmul_precision", float32_matmul_precision)
    if problem is not None:
        raise ValueError(problem)
    dtype = _PRECISION_DTYPES[key]
    return "tf32" if dtype == "float32" and float32_matmul_precision != "highest" else dtype
