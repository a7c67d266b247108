"""Which GPU a trace ran on, and what its arithmetic units can do: the formats it has (TF32,
bf16, fp16 tensor cores) and its dense peaks, from the vendors' data sheets. The what-if model
and the compute headroom take the share of a matmul's time a lower precision removes from the
peaks of the GPU the trace shows, never from another GPU's; a GPU not listed gets no figure.

Peaks are dense (no sparsity), TFLOP/s, for the SXM/OAM parts where a card comes in several
forms (the PCIe parts have lower clocks but the same ratios, and only ratios are used).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str
    generation: str                  # volta, turing, ampere, ada, hopper, blackwell, cdna2, cdna3
    fp32: float                      # vector (CUDA-core) fp32
    fp32_matrix: float | None        # fp32 on matrix units: TF32 on NVIDIA, FP32 matrix on AMD
    half: float                      # fp16/bf16 on tensor cores / matrix units
    bf16: bool                       # bf16 supported at the half rate
    tf32: bool                       # TF32 (or an fp32 matrix path) exists

    @property
    def low_precision(self) -> str:
        """The autocast dtype to advise: bf16 where the GPU has it, else fp16 (with GradScaler
        when training)."""
        return "bf16" if self.bf16 else "fp16"

    def saved_fraction(self, family: str) -> float | None:
        """The share of a kernel family's time lower precision removes, if the kernel ran at
        its unit's peak before and after: 1 - old peak / new peak. Layout conversions are
        channels_last's (all of it); half kernels gain nothing more."""
        if family == "layout":
            return 1.0
        if family == "half":
            return 0.0
        if family == "fp32_tensor_core":
            return 1.0 - self.fp32_matrix / self.half if self.fp32_matrix else None
        if family == "fp32_cuda_core":
            return 1.0 - self.fp32 / self.half
        return None


# name pattern (lower case) -> spec. Order matters: the first match wins (H200 before H100...).
_SPECS: list[tuple[str, GpuSpec]] = [
    (r"\bv100", GpuSpec("V100", "volta", 15.7, None, 125.0, False, False)),
    (r"\bt4\b", GpuSpec("T4", "turing", 8.1, None, 65.0, False, False)),
    (r"\brtx\s*20[0-9]0|titan rtx|quadro rtx", GpuSpec("RTX 20 / Turing", "turing", 11.0, None, 45.0, False, False)),
    (r"\ba100", GpuSpec("A100", "ampere", 19.5, 156.0, 312.0, True, True)),
    (r"\ba10g?\b", GpuSpec("A10", "ampere", 31.2, 62.5, 125.0, True, True)),
    (r"\ba30\b", GpuSpec("A30", "ampere", 10.3, 82.0, 165.0, True, True)),
    (r"\brtx\s*30[0-9]0|\ba40\b|rtx a[0-9]000", GpuSpec("RTX 30 / A40", "ampere", 37.4, 74.8, 149.7, True, True)),
    (r"\bl4\b", GpuSpec("L4", "ada", 30.3, 60.0, 121.0, True, True)),
    (r"\bl40s?\b|rtx\s*40[0-9]0|rtx 6000 ada", GpuSpec("L40 / RTX 40", "ada", 91.6, 183.0, 366.0, True, True)),
    (r"\bh200", GpuSpec("H200", "hopper", 67.0, 495.0, 989.0, True, True)),
    (r"\bh100|\bh800|\bgh200", GpuSpec("H100", "hopper", 67.0, 495.0, 989.0, True, True)),
    (r"\bb200|\bgb200|\bb100", GpuSpec("B200", "blackwell", 80.0, 1100.0, 2250.0, True, True)),
    (r"mi300x|mi325x", GpuSpec("MI300X", "cdna3", 163.4, 653.7, 1307.4, True, True)),
    (r"mi250x?|mi210", GpuSpec("MI250", "cdna2", 47.9, 95.7, 383.0, True, True)),
]
# where a trace gives only the compute capability (no name): the generation's typical part
_BY_CAPABILITY = {(7, 0): "V100", (7, 5): "T4", (8, 0): "A100", (8, 6): "A10", (8, 9): "L4",
                  (9, 0): "H100", (10, 0): "B200"}


def gpu_spec(name: str | None, capability: tuple[int, int] | None = None) -> GpuSpec | None:
    """The spec of a device name (as CUDA or ROCm reports it), else of its compute capability;
    None for a GPU this table does not know."""
    n = (name or "").lower()
    for pattern, spec in _SPECS:
        if n and re.search(pattern, n):
            return spec
    if capability and capability in _BY_CAPABILITY:
        want = _BY_CAPABILITY[capability]
        return next(spec for _p, spec in _SPECS if spec.name == want)
    return None
