"""
Kernel classification
=====================

What the step summary tells of a trace's kernels and device from their names and the trace's
``deviceProperties``: fp32 matrix multiplications and convolutions that use no tensor cores
(:func:`is_fp32_gemm`), communication kernels (:data:`COMMUNICATION_KERNEL_MARK`), and the device's name and
whether it has tensor cores (:func:`device_properties`).

This module imports neither torch nor lightning.
"""

from __future__ import annotations

import re
from typing import Any

from lightning_perf.summarize.events import KinetoTrace

COMMUNICATION_KERNEL_MARK = "nccl"  # ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_SendRecv, ...
# Volta (compute capability 7.0) is the first generation with tensor cores (NVIDIA's CUDA C++ Programming
# Guide, "Warp matrix functions": compute capability 7.0 and above).
TENSOR_CORE_MIN_COMPUTE_MAJOR = 7

# Kernel-name marks of reduced-precision or tensor-core math, checked first (see is_fp32_gemm).
_NOT_FP32_MARKS = (
    *("tf32", "bf16", "fp16", "f16", "half"),
    *("int8", "i8i8", "imma", "fp8", "e4m3", "e5m2"),
    "tensorop",
)
# cuBLAS/cuDNN kernels whose template arguments say fp32: ``gemmk1_kernel<float, ...>``,
# ``cudnn::detail::dgrad_engine<float, ...>``, ``wgrad_alg0_engine<float, ...>``.
_FP32_TEMPLATE = re.compile(r"(gemm\w*|grad\w*_engine)<float\b")
_NOT_FP32 = re.compile("|".join(map(re.escape, _NOT_FP32_MARKS)))


def is_fp32_gemm(name: str) -> bool:
    """Whether a kernel is an fp32 matrix multiplication or convolution that does not use tensor cores.

    Notes:
        1. Names marking reduced precision or tensor-core math are not: ``tf32`` (``sm80_xmma_..._tf32f32_...``,
           ``cutlass_tensorop_s1688fprop_optimized_tf32_...``), ``bf16``, ``fp16``/``f16``/``half``, int8
           (``int8``, ``i8i8``, ``imma``), fp8 (``fp8``, ``e4m3``, ``e5m2``) and CUTLASS's ``tensorop``
           (``cutlass_80_tensorop_s1688gemm_...`` runs fp32 inputs as TF32 on tensor cores).
        2. Then fp32 SIMT GEMMs are: names with ``sgemm`` (cuBLAS's ``volta_sgemm_128x64_nn``,
           ``ampere_sgemm_32x128_tn``, ``cutlass_80_simt_sgemm_...``, ``magma_sgemmEx_kernel``,
           ``sgemm_largek_lds64``, cuDNN's ``implicit_convolve_sgemm``).
        3. fp32 cuDNN convolutions: names with ``scudnn`` (``cudnn_infer_volta_scudnn_128x64_relu_medium_nn_v1``).
        4. Names with ``gemm`` and ``f32``/``fp32`` left after rule 1 (``sm80_xmma_gemm_f32f32_f32f32_f32_...``,
           ``sm86_xmma_fprop_implicit_gemm_f32f32_...``), and GEMM or convolution-gradient kernels templated
           on ``float`` (``gemmk1_kernel<float, ...>``, ``cudnn::detail::dgrad_engine<float, ...>``).
        5. FBGEMM's kernels (``fbgemm_gpu::...``) are no GEMMs: ``fbgemm`` is ignored in the name.
    """
    n = name.lower().replace("fbgemm", "")
    if "gemm" not in n and "scudnn" not in n and "_engine<float" not in n:
        return False  # what rules 2 to 4 need (most kernels: elementwise, reductions, copies, NCCL)
    if _NOT_FP32.search(n):
        return False
    if "sgemm" in n or "scudnn" in n:
        return True
    if "gemm" in n and ("f32" in n or "fp32" in n):
        return True
    return _FP32_TEMPLATE.search(n) is not None


def device_properties(trace: KinetoTrace, device_id: Any) -> dict[str, Any]:
    """Name and tensor cores of the device the kernels ran on (else the first listed)."""
    properties = [p for p in trace.deviceProperties or () if isinstance(p, dict)]
    if not properties:
        return {"device_name": None, "tensor_core_capable": None}
    chosen = next((p for p in properties if p.get("id") == device_id), properties[0])
    major = chosen.get("computeMajor")
    return {
        "device_name": chosen.get("name"),
        "tensor_core_capable": major >= TENSOR_CORE_MIN_COMPUTE_MAJOR if isinstance(major, int) else None,
    }
