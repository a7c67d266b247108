"""memory: camera frames in unified (managed) memory, written by the host and read by the GPU.

Baseline: the frame buffer is one cudaMallocManaged allocation (through the driver API, since
PyTorch has no managed allocator of its own) that the host fills every step, as a decoder
writing into a shared buffer would; the model then reads it on the GPU. Each host write pulls
the pages back to host memory (CPU page faults) and each step's first kernel faults them in
again (GPU page faults and on-demand migrations), inside the step.
Fixed (--fixed): the host fills a pinned buffer and the frames are copied to device memory
once per step (one DMA, no faults), the usual remedy (seed article 4.3).
On a CPU (tests) there is no managed memory: both variants fill a host tensor.
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import StepTimer, mark_step, resolve_device, workload_parser  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    frames: int
    height: int
    width: int


FULL = Sizes(frames=4, height=720, width=1280)     # 4 x 3 x 720 x 1280 fp32 = 42 MiB a step
SMALL = Sizes(frames=1, height=32, width=32)


class _CudaArray:
    """Exposes a device pointer through __cuda_array_interface__, which torch.as_tensor reads."""

    def __init__(self, ptr: int, shape: tuple[int, ...]):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (ptr, False),
                                         "version": 3, "strides": None}


def managed_frames(shape: tuple[int, ...]) -> tuple[torch.Tensor, np.ndarray]:
    """A managed float32 buffer seen both as a CUDA tensor and as a host numpy array."""
    count = int(np.prod(shape))
    libcuda = ctypes.CDLL("libcuda.so.1")
    ptr = ctypes.c_uint64()
    attach_global = 1   # CU_MEM_ATTACH_GLOBAL: any stream, any processor
    rc = libcuda.cuMemAllocManaged(ctypes.byref(ptr), ctypes.c_size_t(count * 4),
                                   ctypes.c_uint(attach_global))
    if rc != 0:
        raise SystemExit(f"cuMemAllocManaged failed with CUresult {rc}")
    host = np.ctypeslib.as_array((ctypes.c_float * count).from_address(ptr.value)).reshape(shape)
    return torch.as_tensor(_CudaArray(ptr.value, shape), device="cuda"), host


def model() -> nn.Module:
    def block(c_in, c_out, stride):
        return [nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out),
                nn.ReLU(inplace=True)]
    return nn.Sequential(*block(3, 16, 4), *block(16, 32, 2), *block(32, 64, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 8))


def main(argv: list[str] | None = None) -> int:
    args = workload_parser(__doc__.splitlines()[0], default_steps=20).parse_args(argv)
    device = resolve_device(args.device)
    sizes = SMALL if args.small else FULL
    shape = (sizes.frames, 3, sizes.height, sizes.width)
    torch.manual_seed(args.seed)
    on_cuda = device.type == "cuda"
    net = model().to(device).eval()
    torch.zeros(1, device=device)          # the CUDA context exists before the driver call
    if on_cuda and not args.fixed:
        frames, host = managed_frames(shape)
    else:
        staging = torch.empty(shape, pin_memory=on_cuda)
        host = staging.numpy()
        frames = torch.empty(shape, device=device)
    timer = StepTimer(device)
    with torch.inference_mode():
        for step in range(args.steps):
            if on_cuda:
                torch.cuda.current_stream().synchronize()   # the GPU is done with the buffer
            host[...] = float(step % 7) * 0.1          # the "decoder" writes this step's frames
            if args.fixed or not on_cuda:
                frames.copy_(staging, non_blocking=on_cuda)
            net(frames)
            timer.lap()
            mark_step()
    timer.report("memory_um_faults", args.fixed, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
