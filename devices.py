"""The device a run computes on: the dtype and its autocast, TF32, the SDPA kernel it gets, device
time, peak memory, the measured matmul peak and MFU, and glibc's malloc kept from returning memory.

Every script that runs a model asks here, so training, evaluation and the benchmarks compute alike.
Process groups and the parallel layout: parallel.py.
"""
import ctypes
import os
import resource
import statistics
import sys
import time
import warnings
from contextlib import nullcontext

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from configurator import ConfigError

DTYPES = ("bfloat16", "float16", "float32")


def check_dtype(dtype, device):
    """A script's dtype key, checked where the script checks its keys (runtime.validate for train.py)."""
    if dtype and dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r}: use one of {DTYPES} or '' (automatic)")
    if dtype == "float16" and not device.startswith("cuda"):
        raise ConfigError("dtype='float16' needs a GPU; use bfloat16 or float32 on CPU")


def precision(dtype, device):
    """The autocast dtype to use ('' picks the best supported one; check_dtype checked it) and its
    autocast context. Used by every script that runs a model, so training and evaluation compute alike.
    On a GPU, float32 matmuls run as TF32 on the tensor cores (the start-up checklist records it;
    docs/speed-and-memory.md): torch's default would leave the tensor cores idle in a float32 run."""
    if not dtype and device.startswith("cuda"):
        # emulated bf16 (V100, T4: no bf16 units) is slower than native fp16 with a GradScaler
        dtype = "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float16"
    elif not dtype:
        # bf16 matmuls are native on CPUs with AVX512-BF16/AMX (faster than fp32 there:
        # docs/speed-and-memory.md) and emulated (slowly) elsewhere.
        dtype = "bfloat16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "float32"
    if dtype == "float32":
        if device.startswith("cuda"):
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        return dtype, nullcontext()
    return dtype, torch.autocast(device_type=device.split(":")[0], dtype=getattr(torch, dtype))


def sdpa_backend(device, dtype, n_head, head_dim, block_size, dropout=0.0):
    """The kernel scaled_dot_product_attention's dispatcher picks for a training step of this shape:
    FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION or MATH. ROCm builds gate the fused kernels
    on some GPUs (RDNA3) and fall back to MATH without a word; MATH materializes the T x T scores,
    which is slower and is not what the memory estimate assumes."""
    q = torch.zeros(1, n_head, block_size, head_dim, device=device, dtype=getattr(torch, dtype), requires_grad=True)
    return SDPBackend(torch._fused_sdp_choice(q, q, q, None, dropout, True)).name


def sdpa_calls(cfg):
    """The scaled_dot_product_attention calls a training step of cfg makes (attn_impl='sdpa', or 'auto'
    where it keeps SDPA), by the shapes ra_model.reciprocal_sdpa passes: 'attention' (q, k, v of one
    head size, causal), 'swap' (the same with query and key exchanged; a (T, T) band mask when
    windowed), 'mix' (q and k doubled to 2 x head size, v zero-padded to match; windowed: 2T keys
    and a (T, 2T) mask)."""
    if cfg["attn_impl"] not in ("sdpa", "auto"):
        return ()
    reciprocal = cfg["model_type"] == "ra" and cfg["ra_pattern"] != "none"
    if not reciprocal:
        return ("attention",)
    mode = "gate" if cfg["ra_pattern"] == "learned" else cfg["ra_mode"]
    calls = {"swap": ["swap"], "gate": ["attention", "swap"], "mix": ["mix"]}[mode]
    if cfg["ra_pattern"] != "all" and "attention" not in calls:
        calls.insert(0, "attention")  # the standard layers
    return tuple(calls)


def fused_sdpa_takes_unequal_value_size(device, dtype):
    """Whether a fused SDPA backend (flash, memory-efficient, cuDNN; not the math kernel) runs a value head
    size unlike the query/key one on this device and dtype (torch dtype): one tiny causal call, tried."""
    q, v = torch.zeros(1, 1, 16, 32, device=device, dtype=dtype), torch.zeros(1, 1, 16, 16, device=device, dtype=dtype)
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    try:
        with warnings.catch_warnings(), sdpa_kernel(fused):
            warnings.simplefilter("ignore")  # each refusing backend warns why
            torch.nn.functional.scaled_dot_product_attention(q, q, v, is_causal=True)
        return True
    except RuntimeError:
        return False


def sdpa_call_backend(call, device, dtype, n_head, head_dim, block_size, window=0, dropout=0.0):
    """The kernel the dispatcher picks for one of sdpa_calls' calls at this shape (see sdpa_backend). Mix
    passes v of the head size where a fused kernel takes that (fused_sdpa_takes_unequal_value_size), else
    v zero-padded to q's doubled size, as ra_model.mix_sdpa does."""
    T, D, windowed = block_size, head_dim, 0 < window < block_size
    dtype = getattr(torch, dtype)
    keys, size = (2 * T if windowed else T, 2 * D) if call == "mix" else (T, D)
    q = torch.zeros(1, n_head, T, size, device=device, dtype=dtype, requires_grad=True)
    k = torch.zeros(1, n_head, keys, size, device=device, dtype=dtype, requires_grad=True)
    v = k
    if call == "mix" and fused_sdpa_takes_unequal_value_size(device, dtype):
        v = torch.zeros(1, n_head, keys, D, device=device, dtype=dtype, requires_grad=True)
    mask = None
    if call != "attention" and windowed:  # a bool mask as reciprocal_sdpa builds it (T x keys)
        mask = torch.ones(T, keys, dtype=torch.bool, device=device)
    scale = 1.0 / D**0.5 if call == "mix" else None
    return SDPBackend(torch._fused_sdp_choice(q, k, v, mask, dropout, mask is None, scale=scale)).name


def sdpa_probe(cfg, device, dtype):
    """{call: kernel} for the SDPA calls of a training step of cfg (sdpa_calls)."""
    head_dim = cfg["n_embd"] // cfg["n_head"]
    return {call: sdpa_call_backend(call, device, dtype, cfg["n_head"], head_dim, cfg["block_size"],
                                    cfg["ra_window"] if call != "attention" else 0, cfg["dropout"])
            for call in sdpa_calls(cfg)}


def sdpa_warning(probe):
    """One line for the start-up checklist when a call falls to the math kernel, else None."""
    slow = [call for call, backend in probe.items() if backend == "MATH"]
    if not slow:
        return None
    return (f"WARNING: SDPA runs the math kernel for {', '.join(slow)} on this device and build: it "
            f"materializes the T x T scores (slower, and more memory than the estimate assumes)")


def synchronize(device):
    """Wait for the work queued on the device (a no-op on CPUs, whose ops finish before they return)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


class DeviceTimer:
    """Seconds of device work, without making the host wait. start() and stop() mark a point in the
    device's queue: on a GPU a CUDA event (the host queues it and goes on), elsewhere the clock after
    `synchronize` (a no-op on CPUs, whose ops finish before they return). seconds(lap) reads a lap
    stop() returned, waiting for its last kernel: train.py reads its steps' laps only when it reads
    their losses (at log steps), so the host runs ahead of the GPU instead of draining its queue twice
    a step. A lap runs from the end of the work queued before start() (evaluation's is not in a step)
    to the step's last kernel, not to the CPU's last launch (a GPU runs behind the Python that queues
    its kernels; compiled graphs more so)."""

    def __init__(self, device):
        self.device = device
        self.started = None

    def mark(self):
        if self.device.startswith("cuda"):
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        synchronize(self.device)
        return time.perf_counter()

    def start(self):
        self.started = self.mark()

    def stop(self):
        """The lap since start(), for seconds()."""
        return self.started, self.mark()

    def seconds(self, lap):
        start, end = lap
        if isinstance(end, torch.cuda.Event):
            end.synchronize()  # elapsed_time needs both events completed
            return start.elapsed_time(end) / 1000
        return end - start

    def elapsed(self):
        """Seconds since start(), waiting for the device (a benchmark's lap, read at once)."""
        return self.seconds(self.stop())


def device_ms(fn, repeats=15, warmup=3):
    """Median milliseconds of fn on the GPU's own clock: CUDA events around each call, so the host's
    launch overhead and the queue ahead of it are not counted."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()  # elapsed_time needs both events completed
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def reset_peak_memory(device):
    """Start a new peak (CUDA); a CPU's peak is the process's maximum resident size, which never resets."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mib(device):
    """The allocator's peak since reset_peak_memory on a GPU; a CPU's process maximum resident size."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # Linux reports KiB


def matmul_peak_flops(device, dtype, repeats=5):
    """The machine's measured matmul peak in FLOP/s for `dtype`: the fastest of a few square
    products (n = 8192 on GPUs). A CPU has no data-sheet peak worth quoting: bf16 is native on some
    (AVX512-BF16, AMX) and emulated hundreds of times slower on others, and other processes take
    their share. So on a CPU n doubles from 256 until one product takes CPU_PROBE_SECONDS (at most
    2048): a native CPU is probed at full size, an emulating one in about a second instead of ~40 s
    at every run's start. Model FLOP/s over this is 'MFU against the measured peak'; measure it
    next to the steps it is compared with."""
    generator = torch.Generator(device).manual_seed(0)  # not the global stream: resume must replay it exactly
    operands = lambda n: [torch.randn(n, n, device=device, generator=generator).to(getattr(torch, dtype))
                          for _ in range(2)]
    timer = DeviceTimer(device)

    def seconds(a, b):
        timer.start()
        torch.mm(a, b)
        return timer.elapsed()

    n = 8192 if device.startswith("cuda") else 256
    a, b = operands(n)
    torch.mm(a, b)  # warms up the kernels and the thread pool, which would pass for a slow product
    first = seconds(a, b)
    while not device.startswith("cuda") and n < 2048 and first < CPU_PROBE_SECONDS:
        n *= 2
        a, b = operands(n)
        first = seconds(a, b)
    return 2 * n**3 / min(seconds(a, b) for _ in range(repeats))


CPU_PROBE_SECONDS = 0.05  # one product this long times well against the clock, on a machine others share


def model_flops_utilization(model, tokens_per_sec_per_device, device, dtype, peak):
    """(MFU, the peak FLOP/s it is against). A measured peak (CPUs) that the model itself outran was
    probed while other work had the cores: it is probed again and the higher one kept. An MFU still
    above 1 is no utilization (the peak is wrong): None, logged as n/a rather than over 100%."""
    mfu = model.estimate_mfu(tokens_per_sec_per_device, device, peak=peak)
    if mfu is not None and mfu > 1 and device == "cpu":
        peak = max(peak, matmul_peak_flops(device, dtype))
        mfu = model.estimate_mfu(tokens_per_sec_per_device, device, peak=peak)
    return (None if mfu is None or mfu > 1 else mfu), peak


def use_deterministic_algorithms(on):
    """deterministic=True: every op takes its deterministic kernel (one that has none raises), cuBLAS a
    fixed workspace, cuDNN no autotuning, so two runs of one config give the same bits on a GPU too.
    Call before the first matmul: cuBLAS reads its workspace setting when its handle is created."""
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(on)


def device_facts(cfg, device, dtype, peak):
    """The start-up checklist's lines on how the device computes: MFU's peak, the SDPA kernel of each
    call a step makes (sdpa_probe; RA's doubled and masked calls included) with a one-line warning when
    one falls to the math kernel, TF32, deterministic algorithms."""
    probe = sdpa_probe(cfg, device, dtype)
    facts = dict(mfu_against=mfu_against(device, dtype, peak),
                 deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
                 sdpa_backend=probe.get("attention", next(iter(probe.values()), None))
                 if probe else f"not used (attn_impl={cfg['attn_impl']!r})",
                 float32_matmuls="TF32" if device.startswith("cuda") and torch.backends.cuda.matmul.allow_tf32
                 else "IEEE float32")
    if set(probe) - {"attention"}:
        facts["sdpa_backends"] = ", ".join(f"{call} {backend}" for call, backend in probe.items())
    if sdpa_warning(probe):
        facts["sdpa_warning"] = sdpa_warning(probe)
    return facts


def mfu_against(device, dtype, peak):
    """Which peak MFU is against, for the start-up checklist."""
    if device == "cpu":
        return f"measured {dtype} matmul peak {peak / 1e9:.0f} GFLOP/s (probed again if the model outruns it)"
    name = torch.cuda.get_device_name(device)
    if peak is None:
        return f"no data-sheet peak listed for {name!r} (model.PEAK_BF16_FLOPS): MFU not reported"
    tf32 = " (float32 matmuls run as TF32, at half that on most cards)" if dtype == "float32" else ""
    return f"data-sheet dense bf16 peak of {name}: {peak / 1e12:.0f} TFLOP/s{tf32}"


def keep_freed_memory():
    """Make glibc's malloc keep freed memory for reuse (Linux CPUs; a no-op elsewhere). By default
    every allocation above the mmap threshold is a fresh mmap, so each step would map, page-fault
    (zero) and unmap its activations again; with mmap and trimming off the heap grows to the step's
    peak once and later steps reuse it. The process keeps its peak resident."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl): leave its allocator alone
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # <malloc.h>
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
