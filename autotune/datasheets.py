"""What vendors' datasheets say of a device, for the figures no run measures: the dense peak
TFLOP/s of datacenter GPUs in each precision (the denominator of MFU). No torch import here."""

from __future__ import annotations

import re

# Dense peak TFLOP/s of datacenter GPUs (vendor datasheets; SXM unless the name says PCIe),
# for MFU. Keys are matched in order against the device name, as whole words ("L4" is not an
# "L40").
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
)


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The device's dense peak TFLOP/s in a precision, or None when not known (CPUs, GPUs not
    in ``PEAK_TFLOPS``)."""
    for key, peaks in PEAK_TFLOPS:
        if re.search(rf"\b{re.escape(key)}\b", device_name):
            return peaks.get(precision)
    return None
