"""What a name tells about a kernel, an op or a CUDA API call: the one place where navdoctor
classifies by name (the loaders, the store's SQL macros, the rules' functions and the compute
headroom all read it).

Kernel names are all a trace reliably carries about how a matmul or convolution ran: the
libraries (cuBLAS, cuBLASLt, cuDNN, CUTLASS, FlashAttention) encode the instruction family and
the data type in them, e.g.

    ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn      tensor cores (mma 16x8x16)
    sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_...  tensor cores (xmma)
    nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNN                        tensor cores (cuBLAS, Hopper)
    cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn      tensor cores (CUTLASS)
    ampere_sgemm_128x64_tn                                           fp32 SIMT: no tensor cores
    implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, ...> fp32 SIMT convolution
    gemv2T_kernel_val<int, int, float, ...>                          matrix-vector: no tensor cores

Everything else (elementwise, reductions, copies, normalisations) is neither matmul nor
convolution, so whether it used tensor cores is not a meaningful question: None.
"""
from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from functools import lru_cache, wraps

# The classifications below are cached by name (traces hold millions of kernels but few
# names; rules call them once per row). Bounded in memory whatever the names: a name of up to
# _SHORT_NAME characters is its own key (at most _CACHE_NAMES of them: ~13 MB per function);
# a longer one is keyed by a 16-byte digest of it (at most _CACHE_LONG of them, ~1 MB), so
# that no cache holds a long name (rules can build names of megabytes, and an unbounded
# cache of them reached gigabytes: DuckDB's memory limit does not cover Python's).
_SHORT_NAME = 256
_CACHE_NAMES = 32768
_CACHE_LONG = 8192
_MISS = object()


def _name_cache(fn):
    """fn(name) cached by name within the bounds above; fn itself is `__wrapped__`."""
    short = lru_cache(maxsize=_CACHE_NAMES)(fn)
    long_names: OrderedDict = OrderedDict()
    lock = threading.Lock()

    @wraps(fn)
    def cached(name):
        if not isinstance(name, str) or len(name) <= _SHORT_NAME:
            return short(name)
        key = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        with lock:
            value = long_names.get(key, _MISS)
            if value is not _MISS:
                long_names.move_to_end(key)
                return value
        value = fn(name)
        with lock:
            long_names[key] = value
            while len(long_names) > _CACHE_LONG:
                long_names.popitem(last=False)
        return value

    def cache_info():
        info = short.cache_info()
        return info._replace(currsize=info.currsize + len(long_names))

    def cache_clear():
        short.cache_clear()
        with lock:
            long_names.clear()

    cached.cache_info, cached.cache_clear = cache_info, cache_clear
    return cached

# CUDA API names (runtime and driver), whatever the entry-point version suffix
# (cuLaunchKernel_ptsz, ..._v7000): the store's SQL macros is_launch_api and is_sync_api are
# made from these patterns (store.MACROS).
_API_SUFFIX = r"(_v[0-9]+|_ptsz|_ptds)*$"
LAUNCH_API_PATTERN = (r"^(cuda|cu)(LaunchKernel|LaunchKernelEx|LaunchKernelExC|"
                      r"LaunchCooperativeKernel|GraphLaunch)" + _API_SUFFIX)
# Calls that block the host until the GPU catches up: explicit synchronisation and the
# synchronous (non-Async) copies.
SYNC_API_PATTERN = (r"^(cuda|cu)(DeviceSynchronize|StreamSynchronize|EventSynchronize|"
                    r"CtxSynchronize|Memcpy|MemcpyDtoH|MemcpyHtoD|MemcpyDtoD|Memcpy2D|MemcpyPeer|"
                    r"Memset)" + _API_SUFFIX)
# The kind of a blocking call (SQL over a name n).
SYNC_KIND_SQL = """
        CASE WHEN n ILIKE '%StreamSynchronize%' THEN 'stream'
             WHEN n ILIKE '%EventSynchronize%' THEN 'event'
             WHEN n ILIKE '%CtxSynchronize%' THEN 'context'
             WHEN n ILIKE '%DeviceSynchronize%' THEN 'device'
             ELSE 'memcpy' END"""
# CUPTI synchronisation records in which the host does not wait: a stream told to wait for an
# event (cudaStreamWaitEvent; Kineto's cuda_sync "Stream Wait Event") and polls
# (cudaEventQuery, cudaStreamQuery). Both loaders leave them out of sync_events.
SYNC_WITHOUT_HOST_WAIT_SQL = (
    "n ILIKE '%StreamWaitEvent%' OR n ILIKE '%Stream Wait Event%' OR n ILIKE '%Query%'")

# Matmul / convolution kernels, by the words the libraries use. 'conv' alone would also match
# 'convert', so convolutions are recognised by fuller words.
_MATMUL_OR_CONV = re.compile(
    r"gemm|gemv|matmul|dot_kernel|hmma|imma|wgmma|xmma|tensorop|nvjet|fmha|flash_?(fwd|bwd|attn)"
    r"|conv(olution|olve|_|[123]d)|fprop|dgrad|wgrad|winograd|implicit_?gemm|scudnn|[hsi]\d{3,5}cudnn")

# Not a matmul even though the name says gemm: cuBLASLt's split-K reduction is an epilogue sum.
_NOT_MATMUL = re.compile(r"splitkreduce|reduce_kernel")

# Tensor-core instruction families and mma shapes in library kernel names:
#   hmma/imma/wgmma/xmma, CUTLASS 'tensorop', cuBLAS-on-Hopper 'nvjet', and the mma shape codes
#   of cuBLAS/cuDNN names: h884, s884 (Volta), s1688/h1688 (Turing, and tf32 on Ampere),
#   s16816/h16816/i8816/i16832 (Ampere+), 'tensor16x8x16' in cuDNN's xmma names.
_TENSOR_CORE = re.compile(
    r"hmma|imma|wgmma|xmma|tensorop|nvjet|tf32|tensor\d+x\d+x\d+"
    r"|[hsib](884|1684|1688|8816|16816|16832|161616)(gemm|cudnn|fprop|dgrad|wgrad|_)")

# CUDA-core markers that win over everything else: CUTLASS 'simt', the fma instruction named in
# cuBLAS's xmma names ('..._ffma_aligna4_...' is an fp32 xmma kernel without tensor cores), and
# matrix-vector products, which never use tensor cores.
_SIMT_STRONG = re.compile(r"simt|[fhd]fma2?(_|$)|gemv")
# Weaker CUDA-core markers, used when no tensor-core marker is present: cuBLAS/cuDNN
# 'sgemm'/'dgemm' families, cuDNN's implicit and Winograd fp32 convolutions.
_SIMT = re.compile(r"[sdcz]gemm|implicit_convolve_|winograd")

# Vendor library kernels, whose fp16/bf16 conv/matmul variants run on tensor cores.
_VENDOR = re.compile(r"cudnn|cutlass|cublas|xmma|^(volta|turing|ampere|hopper|blackwell)_|sm\d{2,3}_")
_HALF_TYPES = re.compile(r"(^|[^a-z0-9])(b?f16|fp16|bf16|bfloat16|half)|f16f16|bf16bf16|_f16|_bf16")

# Attention kernels (FlashAttention, cuDNN/PyTorch fmha) are tensor-core kernels for fp16/bf16.
_ATTENTION = re.compile(r"fmha|flash_?(fwd|bwd|attn)")
_FP32_ONLY = re.compile(r"(^|[^a-z0-9])f32(_|$)|cutlassf_f32|cutlassb_f32|_f32_aligned")


@_name_cache
def tensor_core_kernel(name: str | None) -> bool | None:
    """True for a matmul/convolution kernel that runs on tensor cores, False for one that
    runs on CUDA cores (fp32 SIMT, matrix-vector), None for kernels that are neither matmul nor
    convolution, or whose name does not say (Triton kernels, for one)."""
    if not name:
        return None
    n = name.lower()
    if n.startswith("triton"):
        return None  # Triton's tl.dot may or may not use tensor cores; the name does not say
    if not _MATMUL_OR_CONV.search(n) or _NOT_MATMUL.search(n):
        return None
    if _ATTENTION.search(n):
        return not _FP32_ONLY.search(n)
    if _SIMT_STRONG.search(n):
        return False
    if _TENSOR_CORE.search(n):
        return True
    if _SIMT.search(n):
        return False
    # cuDNN/CUTLASS/cuBLAS half-precision kernels without an explicit mma code (e.g.
    # 'volta_fp16_scudnn_fp16_...', 'cutlass_80_..._bf16_..._tn') use tensor cores.
    if _VENDOR.search(n) and _HALF_TYPES.search(n):
        return True
    return False


def is_matmul_or_conv(name: str | None) -> bool:
    """Whether the kernel is a matmul or convolution (the kernels tensor cores are for)."""
    if not name:
        return False
    n = name.lower()
    return bool(_MATMUL_OR_CONV.search(n)) and not _NOT_MATMUL.search(n)


# Collective and point-to-point communication kernels: NCCL's (ncclKernel_AllReduce_RING_LL_Sum_f32,
# ncclDevKernel_SendRecv, ...), RCCL's (the same names on ROCm, and rccl* ones), NVSHMEM's and
# MSCCL's. Their time is communication, never compute (gloo and MPI run on the host: no kernels).
_COMMUNICATION = re.compile(r"^(void )?(nccl|rccl|msccl|nvshmem)|nccl(dev)?kernel")


@_name_cache
def communication_kernel(name: str | None) -> bool:
    """Whether the kernel moves data between GPUs for a collective or a send/receive."""
    return bool(name) and bool(_COMMUNICATION.search(name.lower()))


# Kernels a training step runs: weight/data gradients of convolutions and matmuls, backward
# kernels by name, the optimizers' update kernels (multi-tensor apply, fused Adam/SGD). Inference
# runs a few too (cuDNN runs a transposed convolution as a dgrad kernel; CUDA graphs copy inputs
# with multi_tensor_apply), so a trace trains when they are a share of its kernels (views.py).
_TRAINING = re.compile(r"wgrad|dgrad|backward|_bwd|bwd_|multi_tensor_apply|fused_adam|adamw?_|sgd_")


@_name_cache
def training_kernel(name: str | None) -> bool:
    return bool(name) and bool(_TRAINING.search(name.lower()))


# Convolutions (vision models) and attention (transformers, language models), by name.
_CONVOLUTION = re.compile(r"conv(olution|olve|_|[123]d)|fprop|dgrad|wgrad|winograd|implicit_?gemm|"
                          r"scudnn|[hsi]\d{3,5}cudnn|depthwise|dwconv|nchwtonhwc|nhwctonchw")
_ATTENTION_ANY = re.compile(r"fmha|flash_?(fwd|bwd|attn)|attention|sdpa|softmax")


@lru_cache(maxsize=65536)
def convolution_kernel(name: str | None) -> bool:
    return bool(name) and bool(_CONVOLUTION.search(name.lower()))


@lru_cache(maxsize=65536)
def attention_kernel(name: str | None) -> bool:
    return bool(name) and bool(_ATTENTION_ANY.search(name.lower()))


def workload_traits(kernel_time: dict[str | None, float]) -> dict[str, bool]:
    """What kind of job a trace's kernels show (kernel name -> time): training (gradient and
    optimizer kernels: 5% of the kernel time or more), vision (convolutions: 10% or more),
    multi_gpu (communication kernels). Remedies worded for one kind are offered to it alone
    (a language model is not told to decode JPEGs on the GPU; rules' `only_for`)."""
    total = sum(kernel_time.values()) or 1.0
    share = lambda pred: sum(t for n, t in kernel_time.items() if pred(n)) / total  # noqa: E731
    return {"training": share(training_kernel) >= 0.05, "vision": share(convolution_kernel) >= 0.10,
            "multi_gpu": share(communication_kernel) > 0.0}


def sql_case_blind(pattern: str) -> str:
    """A regular expression for DuckDB's regexp_matches() that matches a name where `pattern`
    (lower-case words, '_', '|' and '?') matches the name's str.lower(), without lowering
    it: DuckDB's lower() and RE2's case folding differ from Python's outside ASCII (DuckDB
    lowers 'İ' to 'i', Python to 'i' + U+0307; RE2 folds 'ſ' to 's'). The only characters
    outside ASCII that Python lowers to ASCII letters are U+212A (Kelvin sign, to 'k') and
    U+0130 ('İ', to 'i' followed by U+0307, which no letter, '_' or end of word of `pattern`
    matches: hence no 'i' may end a word of it)."""
    if not re.fullmatch(r"[a-z_|?]+", pattern) or re.search(r"i(\||\?|$)", pattern):
        raise ValueError(f"sql_case_blind: unsupported pattern {pattern!r}")
    return "".join(f"[{c}{c.upper()}{chr(0x212A) if c == 'k' else ''}]" if c.isalpha() else c
                   for c in pattern)


# training_kernel() for SQL: the store's macro of the same name (store.MACROS), so that the
# rules that call it need no Python function (store.register_functions).
TRAINING_KERNEL_SQL = f"COALESCE(regexp_matches(n, '{sql_case_blind(_TRAINING.pattern)}'), false)"


# Host-side collectives of torch.distributed's CPU backends, as Kineto records them
# ('gloo:all_reduce', 'mpi:...', 'ucc:...'): the host is blocked in the exchange.
_HOST_COLLECTIVE = re.compile(r"^(gloo|mpi|ucc):")
# The collective a communication kernel or host range runs, from its name, normalised so that
# the ranks of one job compare: NCCL's 'ncclKernel_AllReduce_RING_LL_Sum_float' and
# 'ncclDevKernel_AllReduce_Sum_f32_RING_LL', gloo's 'gloo:all_reduce' are all 'allreduce'.
_COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv",
                "send", "recv", "reduce", "barrier", "gather", "scatter")


def host_collective(name: str | None) -> bool:
    return bool(name) and bool(_HOST_COLLECTIVE.search(name.lower()))


@_name_cache
def collective_kind(name: str | None) -> str | None:
    """'allreduce', 'sendrecv', ... for a communication kernel or host collective; 'other'
    for one whose name does not say (ncclDevKernel_Generic); None for anything else."""
    if not (communication_kernel(name) or host_collective(name)):
        return None
    n = name.lower()
    n = n.split(":", 1)[1] if host_collective(n) else n
    n = n.split("(", 1)[0].replace("_", "")
    for kind in _COLLECTIVES:   # longest names first where one contains another
        if kind in n:
            return kind
    return "other"


# What the standard compute remedies (bf16/fp16 autocast, channels_last) can do to a kernel,
# by its name (navdoctor/headroom.py weighs the families):
#   'layout'            cuDNN's NCHW<->NHWC conversions around convolutions that want NHWC:
#                       channels_last removes them
#   'fp32_tensor_core'  matmul/convolution on tensor cores with fp32 data (TF32: 'tf32',
#                       CUTLASS's 's1688gemm'): bf16 runs the same work at twice the peak
#   'fp32_cuda_core'    matmul/convolution on CUDA cores in fp32 (SIMT, no tensor cores):
#                       bf16 moves it onto tensor cores
#   'half'              matmul/convolution already in fp16/bf16/int8, or on tensor cores in a
#                       precision the name does not say: nothing more from these remedies
#   None                everything else: elementwise, normalisation, pooling, resampling,
#                       reductions, depthwise convolutions, matrix-vector products (memory-bound
#                       work, which the remedies speed up by at most the bytes they save, and
#                       on the mixed corpus's LR-ASPP not at all)
_LAYOUT = re.compile(r"nchwtonhwc|nhwctonchw|foldednchwtonchw|nchw2nhwc|nhwc2nchw")
# depthwise and other direct (non-GEMM) convolutions: cuDNN's 'c1_k1' NHWC kernels and its
# 'convolve_common_engine' (ConvNeXt's 7x7 depthwise measured ~2x from bf16, not a GEMM's gain)
_DEPTHWISE = re.compile(r"depthwise|grouped_direct|dwconv|c1_k1|convolve_common_engine")
# cuDNN's set-up of an xmma kernel's workspace: no arithmetic of its own
_NOT_MATH = re.compile(r"init_device_workspace")
_TF32 = re.compile(r"tf32|tfloat32|tensorop_s(1688|16816)gemm|(^|[^a-z0-9])s1688gemm")
_F32_DATA = re.compile(r"f32f32|(^|[^a-z0-9])f32(_|$)|float")
_HALF_OR_INT = re.compile(_HALF_TYPES.pattern + r"|int8|i8816|i16832|imma|fp8|e4m3|e5m2|(^|_)[hi]\d{3,5}(gemm|cudnn)")


# ATen's own depthwise kernels (conv_depthwise2d/3d: what cuDNN does not take, e.g. NCHW
# MobileNet-style convolutions): their bf16 versions are slower per byte than fp32's, unlike
# cuDNN's direct kernels, which move half the bytes and gain as other memory-bound work does
_ATEN_DEPTHWISE = re.compile(r"conv_depthwise[23]d")


def aten_depthwise_conv(name: str | None) -> bool:
    """A depthwise convolution run by ATen's own kernels (_ATEN_DEPTHWISE), not cuDNN's."""
    return bool(name) and bool(_ATEN_DEPTHWISE.search(name.lower()))


def depthwise_conv(name: str | None) -> bool:
    """A depthwise or other direct (non-GEMM) convolution (_DEPTHWISE): memory-bound, and the
    kernels channels_last slowed on MobileNetV3-style networks (headroom.DEPTHWISE_SHARE)."""
    return bool(name) and bool(_DEPTHWISE.search(name.lower()))


@_name_cache
def compute_remedy_family(name: str | None) -> str | None:
    """'layout', 'fp32_tensor_core', 'fp32_cuda_core', 'half' or None (see above)."""
    if not name:
        return None
    n = name.lower()
    if _LAYOUT.search(n):
        return "layout"
    if not is_matmul_or_conv(n) or depthwise_conv(n) or _NOT_MATH.search(n) or "gemv" in n:
        return None
    if _HALF_OR_INT.search(n):
        return "half"
    if _TF32.search(n):          # TF32 is a tensor-core format, whatever else the name says
        return "fp32_tensor_core"
    tc = tensor_core_kernel(n)
    if tc is False:
        return "fp32_cuda_core"
    if tc and _F32_DATA.search(n):    # (TF32 names returned above)
        return "fp32_tensor_core"
    return "half" if tc else None


def _demangled(name: str) -> str:
    """A demangled kernel name without its return type, its anonymous namespaces spelled one
    way (nsys demangles one as <unnamed>, Kineto as (anonymous namespace))."""
    n = re.sub(r"^void\s+", "", name or "").strip()
    return n.replace("(anonymous namespace)", "{anonymous}").replace("<unnamed>", "{anonymous}")


def kernel_family(name: str) -> str:
    """A kernel's family: its name without template arguments or parameter list, so that the
    same kernel instantiated for another shape or type matches across captures."""
    n = _demangled(name)
    if n.endswith(")"):                  # the parameter list: from its matching '('
        depth = 0
        for i in range(len(n) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(n[i], 0)
            if depth == 0:
                n = n[:i].rstrip() or n
                break
    # CUTLASS wraps every kernel in one template: its first argument is the kernel's name
    # (cuDNN ships its own copy: cutlass__5x_cudnn::Kernel<...>)
    wrapped = re.match(r"^(cutlass\w*::(?:Kernel2?|device_kernel))<([A-Za-z_][\w:]*)", n)
    if wrapped:
        return wrapped.group(2)
    while True:                          # template arguments, innermost first
        shorter = re.sub(r"<[^<>]*>", "", n)
        if shorter == n:
            return n.strip()
        n = shorter


def cut_name(name: str, limit: int) -> str:
    """A name at most `limit` characters long: as it is, else cut with an ellipsis."""
    return name if len(name) <= limit else name[:limit - 1] + "\u2026"


# A name in a finding's text: demangled C++ signatures run to thousands of characters
# (a depthwise convolution's backward kernel: 1.5 KB of accessor templates).
DISPLAY_NAME_CHARS = 100


def display_kernel_name(name: str, limit: int = DISPLAY_NAME_CHARS) -> str:
    """A kernel's name short enough to read in a sentence: as it is when it fits; else without
    its parameter list, with its own template arguments while that fits
    (`at::native::{anonymous}::conv_depthwise2d_grad_weight_kernel<float, unsigned int>`),
    else its family (kernel_family), cut at `limit` with an ellipsis. The JSON report's metrics
    keep the whole name."""
    if not isinstance(name, str) or len(name) <= limit:
        return name
    family = kernel_family(name)
    head = _demangled(name)
    own = family.rsplit("::", 1)[-1]
    at = head.find(own + "<", head.find(family.rsplit("::", 1)[0]) if "::" in family else 0)
    if own and at >= 0:
        rest = head[at + len(own):]
        if rest.startswith("<"):          # the kernel's own template arguments, kept whole
            depth = 0
            for i, ch in enumerate(rest):
                depth += {"<": 1, ">": -1}.get(ch, 0)
                if depth == 0:
                    shown = family + rest[:i + 1]
                    if len(shown) <= limit:
                        return shown
                    break
    return cut_name(family, limit)
