"""What machine a measurement ran on, in one line, for reports and benchmark sections."""

from __future__ import annotations

import platform

from hashlearn._utils.parallel import available_cores

__all__ = ["cpu_description"]


def cpu_description() -> str:
    """CPU model, family/model numbers, SIMD level and available cores, e.g. ``"AMD EPYC
    (family 25 model 1, AVX2 without AVX-512), 2 cores"``: two CPUs with the same model name
    can differ in the vector instructions the kernels use, so timings name both."""
    name, family, model, flags = platform.processor() or "unknown CPU", "?", "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "model name":
                    name = value
                elif key == "cpu family":
                    family = value
                elif key == "model":
                    model = value
                elif key == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    if "avx512_vpopcntdq" in flags:
        simd = "AVX-512 with VPOPCNTDQ"
    elif "avx512f" in flags:
        simd = "AVX-512"
    elif "avx2" in flags:
        simd = "AVX2 without AVX-512"
    else:
        simd = "no AVX2" if flags else "SIMD level unknown"
    return f"{name} (family {family} model {model}, {simd}), {available_cores()} cores"
