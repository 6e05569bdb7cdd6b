"""devices.py on its own: the dtype refusals and choices, autocast, the CPU's timer and peak memory,
the GPU's calls (stood in for on a CPU), MFU by hand, the matmul peak's arithmetic and its private
random stream, the deterministic-algorithms switch. What train.py makes of them (the checklist, the
logged step times and MFU): tests/test_train.py."""
import os
import subprocess
import sys
import time
from contextlib import nullcontext

import pytest
import torch

import configurator
import devices
from helpers import REPO
from model import GPT, GPTConfig


# ----------------------------------------------------------------------------- dtype and autocast

@pytest.mark.parametrize("dtype, device, message", [
    ("bf16", "cpu", r"^dtype='bf16': use one of \('bfloat16', 'float16', 'float32'\) or '' \(automatic\)$"),
    ("half", "cuda:0", r"^dtype='half': use one of"),
    ("float16", "cpu", r"^dtype='float16' needs a GPU; use bfloat16 or float32 on CPU$"),
])
def test_a_dtype_that_cannot_run_is_refused_in_one_line(dtype, device, message):
    with pytest.raises(configurator.ConfigError, match=message):
        devices.check_dtype(dtype, device)


@pytest.mark.parametrize("dtype, device", [("", "cpu"), ("", "cuda"), ("bfloat16", "cpu"), ("float32", "cpu"),
                                           ("float16", "cuda:1")])
def test_a_dtype_that_can_run_passes(dtype, device):
    devices.check_dtype(dtype, device)


@pytest.mark.parametrize("native, chosen", [(True, "bfloat16"), (False, "float32")])
def test_a_cpu_gets_bfloat16_only_where_it_is_native(monkeypatch, native, chosen):
    """Emulated bf16 matmuls are many times slower than float32 on CPUs without AVX512-BF16/AMX."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
    assert devices.precision("", "cpu")[0] == chosen


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # on this CPU the context is built, never entered
def test_a_gpu_with_native_bfloat16_gets_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    dtype, context = devices.precision("", "cuda:1")
    assert dtype == "bfloat16" and (context.device, context.fast_dtype) == ("cuda", torch.bfloat16)


def test_float32_runs_without_autocast_and_bfloat16_matmuls_run_in_bfloat16():
    dtype, context = devices.precision("float32", "cpu")
    assert dtype == "float32" and isinstance(context, nullcontext)
    a, b = torch.ones(4, 4), torch.ones(4, 4)
    dtype, context = devices.precision("bfloat16", "cpu")
    with context:
        assert dtype == "bfloat16" and (a @ b).dtype == torch.bfloat16
    assert (a @ b).dtype == torch.float32  # only inside the context


# ----------------------------------------------------------------------------- time and memory

def test_the_cpu_timer_reads_the_clock_after_synchronizing_at_each_mark(monkeypatch):
    synchronized = []
    monkeypatch.setattr(devices, "synchronize", synchronized.append)
    timer = devices.DeviceTimer("cpu")
    timer.start()
    time.sleep(0.05)
    lap = timer.stop()
    time.sleep(0.2)  # after the lap: not in it
    assert synchronized == ["cpu", "cpu"]
    assert 0.05 <= timer.seconds(lap) < 0.2 and timer.seconds(lap) == lap[1] - lap[0]
    assert timer.elapsed() >= 0.25  # a benchmark's lap: from start() to now


def test_synchronize_and_peak_memory_ask_cuda_only_on_a_gpu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: calls.append(("synchronize", device)))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 2**20 + 2**19)
    devices.synchronize("cpu")
    devices.reset_peak_memory("cpu")
    assert calls == []
    devices.synchronize("cuda:1")
    devices.reset_peak_memory("cuda:1")
    assert calls == [("synchronize", "cuda:1"), ("reset", "cuda:1")]
    assert devices.peak_memory_mib("cuda:1") == 3.5


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_a_cpus_peak_memory_is_the_processes_peak_resident_size_in_mib():
    # A fresh process: a test worker keeps freed heap resident (devices.keep_freed_memory), which a new
    # tensor would reuse without raising the peak.
    script = """
import os, torch, devices
def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
before = resident_mib()
assert devices.peak_memory_mib("cpu") >= before - 1  # a peak, in MiB (Linux's ru_maxrss is in KiB)
block = torch.ones(128 * 2**20 // 4)  # 128 MiB, written
assert devices.peak_memory_mib("cpu") >= before + 100
peak = devices.peak_memory_mib("cpu")
del block
devices.reset_peak_memory("cpu")
assert devices.peak_memory_mib("cpu") >= peak  # the process's peak never resets
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr


def test_device_ms_is_the_median_of_the_timed_calls_after_the_warmup(monkeypatch):
    clock = [0.0]

    class Event:  # torch.cuda.Event on a CPU: the time a fake GPU's clock shows when recorded
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            self.at = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.at - self.at

    durations = iter([100.0, 100.0, 100.0, 5.0, 1.0, 3.0, 9.0, 2.0])  # three warm-up calls, then five timed
    monkeypatch.setattr(torch.cuda, "Event", Event)
    assert devices.device_ms(lambda: clock.__setitem__(0, clock[0] + next(durations)), repeats=5, warmup=3) == 3.0


# ----------------------------------------------------------------------------- MFU

def tiny_model():
    """1 layer, width 8, 4 positions, vocabulary 16, biases, tied head."""
    return GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=16, bias=True))


# By hand: wte 16 x 8 = 128; the layer: ln_1 16, c_attn 8 x 24 + 24 = 216, attn c_proj 64 + 8 = 72,
# ln_2 16, c_fc 8 x 32 + 32 = 288, mlp c_proj 32 x 8 + 8 = 264 (872); ln_f 16: N = 1016 (wpe excluded).
# FLOPs per token: 6 N + 12 x layers x width x positions = 6096 + 384 = 6480.
FLOPS_PER_TOKEN = 6480


def test_mfu_is_the_models_flops_per_second_over_the_peak():
    mfu, peak = devices.model_flops_utilization(tiny_model(), 1000.0, "cpu", "float32", 1e8)
    assert mfu == pytest.approx(FLOPS_PER_TOKEN * 1000 / 1e8) and peak == 1e8  # 0.0648


@pytest.mark.parametrize("probe, mfu, peak", [(1e9, FLOPS_PER_TOKEN * 1000 / 1e9, 1e9), (10.0, None, 1e3)])
def test_a_cpu_peak_the_model_outran_is_probed_again_and_the_higher_kept(monkeypatch, probe, mfu, peak):
    """A peak of 1000 FLOP/s is below the model's 6.48 MFLOP/s: probed again; when even the higher of
    the two gives an MFU above 1, there is no utilization to report."""
    monkeypatch.setattr(devices, "matmul_peak_flops", lambda device, dtype: probe)
    found = devices.model_flops_utilization(tiny_model(), 1000.0, "cpu", "float32", 1e3)
    assert found == (pytest.approx(mfu) if mfu else None, peak)


def test_a_gpu_data_sheet_peak_is_never_probed_and_an_mfu_above_one_is_none(monkeypatch):
    monkeypatch.setattr(devices, "matmul_peak_flops", lambda device, dtype: pytest.fail("probed a GPU's peak"))
    assert devices.model_flops_utilization(tiny_model(), 1000.0, "cuda:0", "bfloat16", 1e3) == (None, 1e3)


def test_a_cpu_without_a_peak_has_no_mfu():
    assert devices.model_flops_utilization(tiny_model(), 1000.0, "cpu", "float32", None) == (None, None)


def test_the_matmul_peak_is_2n_cubed_over_the_fastest_product_and_leaves_the_global_random_stream(monkeypatch):
    """The operands come from a generator of their own, so probing the peak again mid-run (as MFU
    does) never shifts the dropout and batch draws a resume must replay."""
    seconds = iter([3.0, 1.0, 2.0, 4.0])  # the first product of n = 256 is slow enough: it stays at 256
    monkeypatch.setattr(devices.DeviceTimer, "elapsed", lambda self: next(seconds))
    monkeypatch.setattr(torch, "mm", lambda a, b: None)  # the arithmetic, not this machine's speed
    state = torch.get_rng_state()
    assert devices.matmul_peak_flops("cpu", "float32", repeats=3) == 2 * 256**3 / 1.0
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("first_seconds, size", [([0.001, 0.01, 0.04, 0.3], 2048), ([0.01, 0.06], 512),
                                                 ([0.2], 256)])
def test_a_cpu_probe_grows_until_one_product_takes_a_measurable_time(monkeypatch, first_seconds, size):
    """A CPU that emulates bf16 takes ~40 s for one 2048^3 product: the probe stops growing at the
    first size whose product takes CPU_PROBE_SECONDS, a native CPU reaches 2048."""
    sizes, seconds = [], iter(first_seconds + [1.0, 2.0])
    monkeypatch.setattr(devices.DeviceTimer, "elapsed", lambda self: next(seconds))
    monkeypatch.setattr(torch, "mm", lambda a, b: sizes.append(a.shape[0]))
    assert devices.matmul_peak_flops("cpu", "float32", repeats=2) == 2 * size**3 / 1.0
    assert sizes[-1] == size and sorted(set(sizes)) == [256 * 2**i for i in range(len(first_seconds))]


# ----------------------------------------------------------------------------- which peak and which kernels

def test_the_checklist_says_which_peak_mfu_is_against(monkeypatch):
    assert devices.mfu_against("cpu", "bfloat16", 123e9).startswith("measured bfloat16 matmul peak 123 GFLOP/s")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Some GPU")
    assert devices.mfu_against("cuda:0", "bfloat16", None) == ("no data-sheet peak listed for 'Some GPU' "
                                                               "(model.PEAK_BF16_FLOPS): MFU not reported")
    assert devices.mfu_against("cuda:0", "bfloat16", 989.4e12) == "data-sheet dense bf16 peak of Some GPU: 989 TFLOP/s"
    assert devices.mfu_against("cuda:0", "float32", 989.4e12).endswith("(float32 matmuls run as TF32, at half "
                                                                       "that on most cards)")


def test_the_math_kernel_warning_names_only_the_calls_that_fall_to_it():
    assert devices.sdpa_warning({"attention": "FLASH_ATTENTION", "mix": "EFFICIENT_ATTENTION"}) is None
    warning = devices.sdpa_warning({"attention": "FLASH_ATTENTION", "swap": "MATH", "mix": "MATH"})
    assert warning.startswith("WARNING: SDPA runs the math kernel for swap, mix on this device") and "\n" not in warning


# ----------------------------------------------------------------------------- deterministic algorithms

@pytest.fixture
def restore_determinism():
    was, benchmark = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark
    yield
    torch.use_deterministic_algorithms(was)
    torch.backends.cudnn.benchmark = benchmark


def test_deterministic_algorithms_switch_on_with_cublas_workspace_and_no_cudnn_autotuning(monkeypatch,
                                                                                      restore_determinism):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.backends.cudnn.benchmark = True
    devices.use_deterministic_algorithms(True)
    assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    devices.use_deterministic_algorithms(False)
    assert not torch.are_deterministic_algorithms_enabled()


def test_a_users_cublas_workspace_setting_is_kept(monkeypatch, restore_determinism):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    devices.use_deterministic_algorithms(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


@pytest.mark.parametrize("takes_unequal", [True, False])
def test_the_mix_probe_asks_for_the_value_size_mix_passes(monkeypatch, takes_unequal):
    """mix passes v of the head size where a fused kernel takes that, else v padded to q's 2 x head size:
    the checklist's probe asks the dispatcher about that call, not about v = k."""
    seen = []
    monkeypatch.setattr(devices, "fused_sdpa_takes_unequal_value_size", lambda device, dtype: takes_unequal)
    monkeypatch.setattr(torch, "_fused_sdp_choice", lambda q, k, v, *args, **kwargs: seen.append(
        (q.shape[-1], k.shape[-1], v.shape[-1])) or 0)
    devices.sdpa_call_backend("mix", "cpu", "float32", n_head=2, head_dim=16, block_size=8)
    assert seen == [(32, 32, 16 if takes_unequal else 32)]


def test_the_unequal_value_size_probe_answers_for_this_build():
    """The probe runs a real fused call: on a CPU build its flash kernel refuses a value size unlike q's."""
    assert devices.fused_sdpa_takes_unequal_value_size("cpu", torch.float32) is False
