"""Credit in a unit a person reads: GPU-hours of a named reference device.

The ledger credits training FLOPs counted the once-for-all way: one multiply-add is one FLOP
(:mod:`supernet.flops`). A vendor's TFLOP/s counts a multiply-add as two. So one GPU-hour is what the
reference device's FP32 peak does in an hour, halved into multiply-adds:

    1 GPU-hour = 8.1e12 FLOP/s x 3600 s / 2 = 1.458e16 credited FLOPs

Reference: NVIDIA T4, 8.1 TFLOP/s single precision (FP32), dense, from NVIDIA's T4 Tensor Core GPU
data sheet. It is a unit of work, not the time a peer spent: no GPU trains at its peak.
"""

from __future__ import annotations

REFERENCE_DEVICE = "NVIDIA T4"
REFERENCE_FP32_TFLOPS = 8.1  # NVIDIA T4 data sheet: single-precision (FP32) peak, dense
REFERENCE_SOURCE = "NVIDIA T4 Tensor Core GPU data sheet (FP32 single-precision peak)"
VENDOR_FLOPS_PER_MULTIPLY_ADD = 2
CREDIT_PER_GPU_HOUR = REFERENCE_FP32_TFLOPS * 1e12 * 3600 / VENDOR_FLOPS_PER_MULTIPLY_ADD
"""Credited training FLOPs (multiply-adds) in one GPU-hour of the reference device: 1.458e16."""


def gpu_hours(credit: float) -> float:
    """``credit`` (credited training FLOPs) in GPU-hours of :data:`REFERENCE_DEVICE`."""
    return credit / CREDIT_PER_GPU_HOUR


def gpu_hour_unit() -> dict:
    """The unit's definition, for machine-readable output beside the figures in it."""
    return {
        "device": REFERENCE_DEVICE,
        "fp32_tflops": REFERENCE_FP32_TFLOPS,
        "credited_flops_per_gpu_hour": CREDIT_PER_GPU_HOUR,
        "source": REFERENCE_SOURCE,
    }
