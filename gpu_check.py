"""The GPU self-check: a user's first hour on one GPU in one command (how long it takes: docs/speed-and-memory.md).

    python gpu_check.py                        # prints one table, writes gpu_check.json
    python gpu_check.py --json=out.json
    python gpu_check.py --only=kernels,memory  # some sections (a rerun after a fix)
    python gpu_check.py --dry_run=True         # no GPU: the CPU-safe rows at tiny shapes, the JSON, the table
    python gpu_check.py --help                 # this text and the keys

Two kinds of rows. A correctness row says pass or FAIL, and the exit status is 1 when one failed.
A speed row compares a measurement with a target and says pass or WARN: a slow kernel is a
warning, not a failed check. 'skip' is a check that cannot run here (a package missing, one GPU
where it needs two), 'info' a measurement with no verdict. Sections (docs/speed-and-memory.md):
- kernels: the fused RA kernels (kernels/ra_attention.py) against the float64 reference
  (ra_model.reciprocal_manual): every mode, windowed or not, the input gradients and those of alpha
  and the gate, q/k/v as the model passes them (strided views of one projection), the autotuner's
  winner at every T bucket; GPT-2's EVEN + TMA path (T = 1024, 2048 at D=64) with TMA on and off
  (RA_TMA), naming what every launch took; the SDPA kernel of each call RA makes (devices.sdpa_probe,
  mix at the shape it passes); speed of fused and SDPA-routed RA against SDPA on device time (bf16,
  D=64, causal, fwd+bwd, 8 x 12 heads) at T = 1024, 2048, 4096, and fused with TMA off / on;
- training: one compiled block per attention path, 1 graph and 0 breaks (torch._dynamo.explain);
  GPT-2 124M bf16 at 16 x 1024 compiled (train.py): tokens/s and MFU against the data sheet's dense
  bf16 peak; its eager step by DeviceTimer against CUDA events (and the wall clock); float32 (TF32)
  against bfloat16 loss over 300 steps of a small model; the chunked, Liger and CCE heads against the float64 full head;
  RA's attn_impl='auto' times both paths of every call and keeps the faster;
- memory: sharding.memory_estimate against the allocator's peaks, step and evaluation, for the
  baseline, RA (fused and SDPA), MLA, gated attention and activation checkpointing;
- distributed: torchrun --nproc_per_node=1 on NCCL, a DDP and an FSDP2 step, a DCP save and resume
  that continues bit for bit; with 2+ GPUs DDP's losses against one GPU's at the same global batch;
- determinism: two identical runs (bitwise equal or not: reported), two with deterministic=True
  (bitwise equal, or FAIL) and that option's cost in step time.
Without a GPU it says so in one line and exits 1. Not part of the test suite: commit its JSON to
docs/ with the card's name. --dry_run=True needs no GPU: in a fresh process, the kernel rows at tiny shapes
under the Triton interpreter (TMA forced), the compile rows, the step timer on a tiny model with CUDA events
on the host clock, a skip row for each GPU-only part, the JSON ("dry_run": true) and the table (about 20 s
on 2 CPU cores; tests/test_gpu_check.py runs it).
"""
import functools
import importlib.util
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

import configurator

REPO = os.path.dirname(os.path.abspath(__file__))
SECTIONS = ("kernels", "training", "memory", "distributed", "determinism")
OPTIONS = dict(
    json="gpu_check.json",  # where the rows are written
    only="",  # sections to run, comma-separated (kernels,training,memory,distributed,determinism); '' runs all
    dry_run=False,  # no GPU: the CPU-safe rows at tiny shapes (kernels under the Triton interpreter), JSON, table
)
STATUSES = ("pass", "FAIL", "WARN", "skip", "info")

# Largest error against the float64 reference, relative to the reference's largest magnitude.
TOLERANCE = {"float32": 2e-3, "bfloat16": 3e-2, "float16": 5e-3}
SUMMED_GRADIENTS = ("dalpha", "dgate")  # one value per head, summed over every (query, key) pair
T_BUCKETS = (60, 100, 200, 400, 1000, 2000, 4000)  # one length in each power-of-two bucket, 64 ... 4096
# Issue 42's targets, bf16, D=64, causal, forward + backward, 8 x 12 heads (time / SDPA's)
SPEED_TARGETS = {"mix": 2.2, "swap": 1.3}
BEATS_SDPA_ROUTE_UP_TO = 2048  # the fused mix kernel should beat RA through SDPA at T <= this
SPEED_T = (1024, 2048, 4096)
EVEN_T = (1024, 2048)  # GPT-2's lengths: whole tiles at D=64, so EVEN (mask-free loads), and TMA on sm90
TIMING = dict(repeats=15, warmup=3)  # devices.device_ms per measured path
# one block of this 2-layer model is explained per compiled attention path (compile_rows); D = 64 as GPT-2's heads
COMPILE_MODEL = dict(n_layer=2, n_head=2, n_embd=128, block_size=128, vocab_size=256)
COMPILE_PATHS = {
    "GPT block": dict(ra_pattern="none"),
    "RA swap, sdpa": dict(ra_mode="swap"), "RA mix, sdpa": dict(ra_mode="mix"), "RA gate, sdpa": dict(ra_mode="gate"),
    "RA mix windowed, sdpa": dict(ra_mode="mix", ra_window=48),
    "RA swap, triton": dict(ra_mode="swap", attn_impl="triton"),
    "RA mix, triton": dict(ra_mode="mix", attn_impl="triton"),
    "RA gate, triton": dict(ra_mode="gate", attn_impl="triton"),
    "RA mix, auto (what it measured)": dict(ra_mode="mix", attn_impl="auto"),
}
MFU_TARGET = 0.45
PARITY_STEPS, PARITY_TAIL, PARITY_TOLERANCE = 300, 50, 0.03  # nats, mean loss of the last PARITY_TAIL steps
MEMORY_MARGIN = 0.25  # the estimate (less its stated GPU reserve) within 25% of the allocator's peaks
DDP_TOLERANCE = 1e-3  # 2 GPUs against one at the same global batch: float32 sums in another order

TRAIN = os.path.join(REPO, "train.py")
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone")
# A small model on a learnable toy stream: what the training, distributed and determinism runs share
SMALL = dict(dataset="toy", vocab_size=256, n_layer=4, n_head=4, n_embd=256, block_size=256, batch_size=8,
             gradient_accumulation_steps=1, max_iters=30, lr_decay_iters=30, warmup_iters=5, learning_rate=3e-3,
             eval_interval=1000, eval_iters=2, log_interval=1, dtype="bfloat16", save_checkpoint=False,
             device="cuda", compile=False)  # compile's default is True on CUDA: the rows that compile say so
GPT2 = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304)


# ----------------------------------------------------------------------------- rows and verdicts

def row(section, check, status, measured, detail=""):
    assert status in STATUSES, status
    return dict(section=section, check=check, status=status, measured=measured, detail=detail)


def correctness(section, check, ok, measured, detail=""):
    """A correctness row: pass, or FAIL (the exit status)."""
    return row(section, check, "pass" if ok else "FAIL", measured, detail)


def speed(section, check, ok, measured, detail=""):
    """A speed row: pass, or WARN (never the exit status)."""
    return row(section, check, "pass" if ok else "WARN", measured, detail)


def exit_status(rows):
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


def relative_error(got, want):
    """max |got - want| / max |want|, in float64; infinite where no gradient arrived (got is None) or
    a value is not finite (so that the worst of several is never a NaN that compares false)."""
    if got is None:
        return float("inf")
    want = want.double()
    error = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
    return error if math.isfinite(error) else float("inf")


def guarded(section, check, *args):
    """A section's rows; a crash is one FAIL row naming it, and the other sections still run."""
    try:
        return check(*args)
    except Exception as e:  # noqa: BLE001 - any crash is the finding
        message = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        return [row(section, f"{section}: {check.__name__}", "FAIL", "crashed", message)]
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def table(rows):
    width = max(len(r["check"]) for r in rows)
    lines = [f"{'section':<11}  {'check':<{width}}  {'':<4}  {'measured':<24}  detail"]
    lines += [f"{r['section']:<11}  {r['check']:<{width}}  {r['status']:<4}  {r['measured']:<24}  {r['detail']}"
              for r in rows]
    return "\n".join(lines)


def summary(rows, device, seconds, section_seconds=None):
    """The JSON written: the machine, the seconds (each section's too), the rows and their counts by status."""
    return dict(device=device, torch=torch.__version__, hip=torch.version.hip, cuda=torch.version.cuda,
                gpus=torch.cuda.device_count(), seconds=round(seconds, 1), section_seconds=section_seconds or {},
                counts={s: sum(r["status"] == s for r in rows) for s in STATUSES},
                exit_status=exit_status(rows), rows=rows)


def sections_to_run(only):
    chosen = [s for s in only.split(",") if s] if only else list(SECTIONS)
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        raise configurator.ConfigError(f"--only={only}: unknown sections {unknown}; use a comma list of "
                                       f"{','.join(SECTIONS)}")
    return chosen


# ----------------------------------------------------------------------------- kernels

def model_qkv(B, H, T, D, generator, device):
    """(x, q, k, v): float64 x (B, T, 3 H D) and its q, k, v as CausalSelfAttention passes them: strided
    views of one projection, (B, H, T, D), last dimension contiguous, heads and time not."""
    x = torch.randn(B, T, 3 * H * D, device=device, dtype=torch.float64, generator=generator)
    return x, *views(x, H)


def views(x, H):
    B, T, C3 = x.shape
    return [t.view(B, T, H, C3 // 3 // H).transpose(1, 2) for t in x.split(C3 // 3, dim=2)]


def ra_errors(attention, mode, dtype, B, H, T, D, window, device, seed=0):
    """Worst relative error of `attention` (reciprocal_attention's signature) against
    reciprocal_manual in float64: the output, dx (dq dk dv through the model's strided views), and
    the gradient of alpha (mix, one per head, as the model's learned alpha) or of the gate logit."""
    from ra_model import reciprocal_manual
    g = torch.Generator(device).manual_seed(seed)
    x, *_ = model_qkv(B, H, T, D, g, device)
    dout = torch.randn(B, H, T, D, device=device, dtype=torch.float64, generator=g)
    ref_x, low_x = x.clone().requires_grad_(), x.to(getattr(torch, dtype)).requires_grad_()
    # mix: one alpha per head (ra_alpha_learn='head'); gate: the model's (1,) logit, passed as a scalar
    base = (torch.linspace(0.2, 0.8, H, device=device, dtype=torch.float64) if mode == "mix"
            else torch.tensor([0.3], device=device, dtype=torch.float64))
    ref_param, low_param = base.clone().requires_grad_(), base.float().requires_grad_()
    if mode == "mix":
        ref = reciprocal_manual(*views(ref_x, H), mode, ref_param.view(1, H, 1, 1), None, window, 0.0)
        out = attention(*views(low_x, H), mode, alpha=low_param.view(1, H, 1, 1), window=window)
    else:
        p = torch.sigmoid(ref_param) if mode == "gate" else None
        ref = reciprocal_manual(*views(ref_x, H), mode, 0.0, p, window, 0.0)
        out = attention(*views(low_x, H), mode, gate_logit=low_param.view(()) if mode == "gate" else None,
                        window=window)
    ref.backward(dout)
    out.backward(dout.to(out.dtype))
    errors = dict(out=relative_error(out, ref), dx=relative_error(low_x.grad, ref_x.grad))
    if mode in ("mix", "gate"):
        errors["dalpha" if mode == "mix" else "dgate"] = relative_error(low_param.grad, ref_param.grad)
    return errors


def pytorch_attention(q, k, v, mode, alpha=None, gate_logit=None, window=0):
    """RA through PyTorch's SDPA with reciprocal_attention's signature: the yardstick of a dtype's own error."""
    from ra_model import reciprocal_sdpa
    return reciprocal_sdpa(q, k, v, mode, alpha, None if gate_logit is None else torch.sigmoid(gate_logit), window, 0.0)


def allowances(errors, yardstick, dtype):
    """The largest error each entry may have. dalpha and dgate sum B x H x T x T terms of both signs, so
    their relative error grows with the sum's cancellation on the drawn inputs, not only with the kernel:
    they may reach twice PyTorch's own error in the same dtype on the same inputs (flash-attention's
    test convention), never less than the tolerance. Everything else: the tolerance."""
    allowed = dict.fromkeys(errors, TOLERANCE[dtype])
    for key in SUMMED_GRADIENTS:
        if key in errors and math.isfinite(yardstick.get(key, float("inf"))):
            allowed[key] = max(TOLERANCE[dtype], 2 * yardstick[key])
    return allowed


def graded_errors(attention, mode, dtype, B, H, T, D, window, device, seed=0):
    """{name: (error, allowed)} of `attention` against the float64 reference (ra_errors)."""
    errors = ra_errors(attention, mode, dtype, B, H, T, D, window, device, seed)
    yardstick = (ra_errors(pytorch_attention, mode, dtype, B, H, T, D, window, device, seed)
                 if any(key in errors for key in SUMMED_GRADIENTS) else {})
    allowed = allowances(errors, yardstick, dtype)
    return {key: (error, allowed[key]) for key, error in errors.items()}


def worst(graded):
    """(error / allowed, error, allowed, 'name (mode window)') of the worst entry over a list of (label, graded)."""
    return max(((error / allowed, error, allowed, f"{key} ({label})") for label, entries in graded
                for key, (error, allowed) in entries.items()), key=lambda t: t[0])


def accuracy_row(check, graded, what):
    ratio, error, allowed, where = worst(graded)
    return correctness("kernels", check, ratio <= 1, f"{error:.1e}", f"{what}: worst {where}, allowed {allowed:.1e} "
                       f"(the tolerance, or for dalpha/dgate twice PyTorch's own error in the dtype)")


def accuracy_rows(attention, device, cases, T=300, B=2, H=4):
    """One row per (dtype, D): the worst error over modes and windows, against its allowance."""
    return [accuracy_row(f"RA kernel {dtype} D={D}",
                         [(f"{mode}, window {w}", graded_errors(attention, mode, dtype, B, H, T, D, w, device))
                          for mode in ("swap", "mix", "gate") for w in windows],
                         f"out, dx, dalpha, dgate over swap/mix/gate x window {windows}, strided q/k/v")
            for dtype, D, windows in cases]


def bucket_rows(attention, device, lengths=T_BUCKETS, H=4, dtype="bfloat16"):
    """The autotuner keys its winners by T's power-of-two bucket: check each bucket's winner (mix and
    swap: different kernels) numerically in bf16."""
    graded = [(f"{mode}, T={T}", graded_errors(attention, mode, dtype, 1, H, T, 64, 0, device, seed=T))
              for T in lengths for mode in ("mix", "swap")]
    return [accuracy_row("RA kernel autotuned winners, every T bucket", graded,
                         f"{dtype}, D=64, T={','.join(map(str, lengths))}")]


def repeat_bitwise(attention, device, T=300, B=2, H=4, D=64):
    """Whether two identical forward + backward calls give the same output and gradients, bit for bit."""
    results = []
    for _ in range(2):
        g = torch.Generator(device).manual_seed(0)
        x = torch.randn(B, T, 3 * H * D, device=device, generator=g).to(torch.bfloat16).requires_grad_()
        alpha = torch.full((H,), 0.5, device=device, requires_grad=True)
        out = attention(*views(x, H), "mix", alpha=alpha.view(1, H, 1, 1))
        out.backward(torch.ones_like(out))
        results.append((out, x.grad, alpha.grad))
    return all(torch.equal(a, b) for a, b in zip(*results))


def deterministic_kernel_rows(attention, device, T=300, B=2, H=4, D=64, dtype="bfloat16"):
    """The fused kernel's deterministic=True path (no atomics), where the kernel offers one: accurate,
    and repeatable bit for bit."""
    if "deterministic" not in inspect.signature(attention).parameters:
        return [row("kernels", "RA kernel deterministic=True", "skip", "no option",
                    "this reciprocal_attention has no deterministic= option")]
    fixed = functools.partial(attention, deterministic=True)
    graded = [(f"{mode}, window {w}", graded_errors(fixed, mode, dtype, B, H, T, D, w, device))
              for mode in ("swap", "mix", "gate") for w in (0, 37)]
    equal = repeat_bitwise(fixed, device, T, B, H, D)
    return [accuracy_row(f"RA kernel deterministic=True, {dtype} D={D}", graded, "swap/mix/gate x window (0, 37)"),
            correctness("kernels", "RA kernel deterministic=True, repeated", equal,
                        "bitwise equal" if equal else "differs", "two identical mix calls: output, dx, dalpha")]


class recorded_paths:
    """Within it, what each kernel launch decided (ra_attention's EVEN and TMA heuristics, autotuner trials
    included): self.taken = {('EVEN' or 'TMA', True or False), ...}, so a row can show its path ran."""

    def __init__(self, ra):
        self.ra, self.taken, self.saved = ra, set(), []

    def __enter__(self):
        for tuned in (self.ra._fwd_tuned, self.ra._bwd_col_tuned, self.ra._bwd_row_tuned):
            values = tuned.fn.values  # triton.heuristics' {name: decide(args)}
            for name in ("EVEN", "TMA"):
                self.saved.append((values, name, values[name]))
                values[name] = self.recorder(name, values[name])
        return self

    def recorder(self, name, decide):
        def recorded(args):
            taken = decide(args)
            self.taken.add((name, bool(taken)))
            return taken
        return recorded

    def __exit__(self, *exc):
        for values, name, decide in self.saved:
            values[name] = decide


def tma_here(ra, device):
    """Whether launches on this device load by TMA where the tiles allow it (sm90; the interpreter where forced)."""
    if ra.INTERPRET:
        return ra.INTERPRET_TMA
    return torch.device(device).type == "cuda" and ra.tma_loads(ra.gpu_target(torch.device(device)))


class tma_switched:
    """ra_attention's RA_TMA switch (USE_TMA) set for a block of rows, restored afterwards."""

    def __init__(self, ra, on):
        self.ra, self.on = ra, on

    def __enter__(self):
        self.saved, self.ra.USE_TMA = self.ra.USE_TMA, self.on

    def __exit__(self, *exc):
        self.ra.USE_TMA = self.saved


def even_tma_rows(attention, device, lengths=EVEN_T, D=64, H=4, dtype="bfloat16", windows=(0, 256)):
    """The path GPT-2 takes on an H100/H200 (T a multiple of every tile at D=64: EVEN, mask-free loads; on
    sm90 the streamed tiles by TMA) against the float64 reference: output, dx (dq, dk, dv through the model's
    strided views) and dalpha/dgate, swap/mix/gate x windows, bf16. With TMA as the GPU takes it and
    with RA_TMA's switch off (the pointer loads), each row naming what its launches took: a row whose
    launches did not take the path it names FAILs."""
    from kernels import ra_attention as ra
    rows = []
    states = (True, False) if tma_here(ra, device) else (False,)
    for tma in states:
        with tma_switched(ra, tma), recorded_paths(ra) as paths:
            graded = [(f"{mode}, window {w}, T={T}", graded_errors(attention, mode, dtype, 1, H, T, D, w, device,
                                                                     seed=T))
                      for T in lengths for mode in ("swap", "mix", "gate") for w in windows]
        path = " + TMA" if tma else ", TMA off (RA_TMA=0)"
        name = f"RA kernel EVEN{path}, {dtype} D={D} T={','.join(map(str, lengths))}"
        expected, taken = {("EVEN", True), ("TMA", tma)}, paths.taken
        what = lambda pairs: ", ".join(f"{k}={v}" for k, v in sorted(pairs))
        if taken != expected:  # every launch at these shapes should take the path the row names
            rows.append(correctness("kernels", name, False, "path not taken", f"launches took {what(taken)}; "
                                    f"expected every launch {what(expected)}"))
            continue
        rows.append(accuracy_row(name, graded, f"every launch {what(taken)}; out, dx, dalpha, dgate over "
                                               f"swap/mix/gate x window {windows}"))
    if len(states) == 1:
        return rows + [row("kernels", "RA kernel EVEN + TMA", "skip", "no TMA here",
                           "TMA loads run on sm90 only (ra_attention.tma_loads)")]
    return rows + [tma_bitwise_row(attention, ra, device, lengths[0], D, H)]


def tma_bitwise_row(attention, ra, device, T, D, H):
    """TMA against the pointer loads on the same inputs, deterministic=True (no atomics): the same tiles summed
    in the same order, bit for bit under the interpreter (tests/test_kernels.py). On a GPU the compiler may
    pick other matrix instructions for descriptor-loaded tiles: reported (info), the accuracy rows judge."""
    differ = []
    for mode in ("swap", "mix", "gate"):
        results = []
        for tma in (True, False):
            g = torch.Generator(device).manual_seed(0)
            x = torch.randn(1, T, 3 * H * D, device=device, generator=g).to(torch.bfloat16).requires_grad_()
            param = torch.full((H,) if mode == "mix" else (), 0.3, device=device, requires_grad=True)
            extra = dict(alpha=param.view(1, H, 1, 1)) if mode == "mix" else {}
            extra = dict(gate_logit=param) if mode == "gate" else extra
            with tma_switched(ra, tma):
                out = attention(*views(x, H), mode, deterministic=True, **extra)
                out.backward(torch.ones_like(out))
            results.append((out, x.grad, param.grad))
        pairs = [(a, b) for a, b in zip(*results) if a is not None]
        if not all(torch.equal(a, b) for a, b in pairs):
            gap = max((a.double() - b.double()).abs().max().item() for a, b in pairs)
            differ.append(f"{mode} (max |diff| {gap:.1e})")
    return row("kernels", f"RA kernel TMA vs pointer loads, T={T}", "info",
               "bitwise equal" if not differ else "differ", "deterministic=True, bf16, output, dx, dalpha/dgate: "
               + ("swap, mix, gate equal bit for bit" if not differ else "; ".join(differ)))


def sdpa_probe_rows(device):
    """Which SDPA kernel each of RA's calls gets at GPT-2's shape in bf16: MATH is a warning."""
    import devices
    import runtime
    rows = []
    for mode, window in (("mix", 0), ("mix", 128), ("swap", 0), ("gate", 128)):
        cfg = dict(runtime.DEFAULTS, **GPT2, model_type="ra", ra_pattern="all", ra_mode=mode, ra_window=window)
        probe = devices.sdpa_probe(cfg, device, "bfloat16")
        rows.append(speed("kernels", f"SDPA kernel for RA {mode}, window {window}", devices.sdpa_warning(probe) is None,
                          ", ".join(sorted(set(probe.values()))),
                          ", ".join(f"{c}: {b}" for c, b in probe.items()) + " (MATH materializes the scores)"))
    return rows


def speed_rows(ms, T):
    """Rows from the median times (ms) of 'sdpa', 'mix', 'swap' (fused) and 'sdpa mix', 'sdpa swap' (RA
    through SDPA) at one T: the fused kernels against the targets, a WARN where one is missed."""
    rows = []
    for mode, target in SPEED_TARGETS.items():
        ratio = ms[mode] / ms["sdpa"]
        rows.append(speed("kernels", f"fused {mode} / SDPA, T={T}", ratio <= target, f"{ratio:.2f}x",
                          f"{ms[mode]:.2f} ms vs {ms['sdpa']:.2f} ms; target <= {target}x"))
    route = ms["mix"] / ms["sdpa mix"]
    rows.append(speed("kernels", f"fused mix / RA through SDPA, T={T}", route < 1 or T > BEATS_SDPA_ROUTE_UP_TO,
                      f"{route:.2f}x", f"{ms['mix']:.2f} ms vs {ms['sdpa mix']:.2f} ms; target < 1x at T <= "
                      f"{BEATS_SDPA_ROUTE_UP_TO}" + ("" if T <= BEATS_SDPA_ROUTE_UP_TO else " (none here)")))
    for mode in ("mix", "swap"):
        rows.append(row("kernels", f"RA through SDPA {mode} / SDPA, T={T}", "info",
                        f"{ms['sdpa ' + mode] / ms['sdpa']:.2f}x", f"{ms['sdpa ' + mode]:.2f} ms"))
    return rows


def kernel_speed_rows(device, lengths=SPEED_T, B=8, H=12, D=64):
    """bf16, D=64, causal, forward + backward, 8 x 12 heads, q/k/v as the model passes them."""
    import devices
    from kernels import ra_attention as ra
    from kernels.ra_attention import reciprocal_attention
    from ra_model import reciprocal_sdpa
    rows, tma = [], tma_here(ra, device)
    for T in lengths:
        x = torch.randn(B, T, 3 * H * D, device=device, dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(B, H, T, D, device=device, dtype=torch.bfloat16)
        alpha = torch.tensor(0.5, device=device)
        calls = {
            "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "mix": lambda q, k, v: reciprocal_attention(q, k, v, "mix", alpha=alpha),
            "swap": lambda q, k, v: reciprocal_attention(q, k, v, "swap"),
            "sdpa mix": lambda q, k, v: reciprocal_sdpa(q, k, v, "mix", alpha, None, 0, 0.0),
            "sdpa swap": lambda q, k, v: reciprocal_sdpa(q, k, v, "swap", None, None, 0, 0.0),
        }

        def step(call):
            x.grad = None
            call(*views(x, H)).backward(dout)

        ms = {name: devices.device_ms(lambda: step(call), **TIMING) for name, call in calls.items()}
        rows += speed_rows(ms, T)
        if tma:  # the same launches with RA_TMA=0: EVEN's pointer loads, the autotuner's tiles unchanged
            with tma_switched(ra, False):
                off = {mode: devices.device_ms(lambda: step(calls[mode]), **TIMING) for mode in ("mix", "swap")}
            rows += [row("kernels", f"fused {mode} TMA off / on, T={T}", "info", f"{off[mode] / ms[mode]:.2f}x",
                         f"{off[mode]:.2f} ms with RA_TMA=0 vs {ms[mode]:.2f} ms with TMA loads") for mode in off]
    return rows


# The kernel section's shapes on a GPU, and in a dry run (CPU, the kernels under the Triton interpreter: float32,
# since it computes bf16 dots in float32 anyway, and a few terms of dalpha in bf16 are noise, not a check)
GPU_SHAPES = dict(cases=[("bfloat16", 64, (0, 37)), ("bfloat16", 128, (0, 37)), ("float16", 64, (0, 37)),
                         ("float32", 64, (0, 37))],
                  accuracy=dict(T=300, B=2, H=4), buckets=dict(lengths=T_BUCKETS, H=4),
                  deterministic=dict(T=300, B=2, H=4, D=64), even=dict(lengths=EVEN_T, D=64, H=4),
                  speed=dict(lengths=SPEED_T, B=8, H=12, D=64))
DRY_SHAPES = dict(cases=[("float32", 16, (0, 5))], accuracy=dict(T=20, B=1, H=2),
                  buckets=dict(lengths=(20, 40), H=2, dtype="float32"),
                  deterministic=dict(T=20, B=1, H=2, D=16, dtype="float32"),
                  even=dict(lengths=(32,), D=16, H=2, dtype="float32", windows=(0, 12)),
                  speed=dict(lengths=(32,), B=1, H=1, D=16))


def kernel_rows(device, shapes=GPU_SHAPES):
    import ra_model
    rows = sdpa_probe_rows(device)
    why = ra_model.fused_kernels().why_not_fused(*(torch.zeros(1, 1, 16, 64, device=device),) * 3)
    if why is not None:
        return rows + [row("kernels", "fused RA kernels", "skip", "not run", why)]
    from kernels.ra_attention import reciprocal_attention
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means IEEE float32 in the accuracy rows
    try:
        rows += accuracy_rows(reciprocal_attention, device, shapes["cases"], **shapes["accuracy"])
        rows += bucket_rows(reciprocal_attention, device, **shapes["buckets"])
        rows += deterministic_kernel_rows(reciprocal_attention, device, **shapes["deterministic"])
        rows += even_tma_rows(reciprocal_attention, device, **shapes["even"])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = True
    return rows + kernel_speed_rows(device, **shapes["speed"])


# ----------------------------------------------------------------------------- training

def toy_data(directory):
    """A learnable token stream (noisy counting over 256 ids), as tests/conftest.py's."""
    import tokendata
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 400_000), ("val", 40_000)):
        tokens = (np.arange(n) + (rng.random(n) < 0.1) * rng.integers(0, 256, n)) % 256
        tokendata.write_split(os.path.join(directory, f"{split}.bin"), [tokens])
    return directory


def train_argv(data_dir, out_dir, options, launcher=(sys.executable,)):
    """train.py's command line: SMALL with `options` over it."""
    keys = dict(SMALL, **options)
    return [*launcher, TRAIN, f"--data_dir={data_dir}", f"--out_dir={out_dir}",
            *(f"--{k}={v}" for k, v in keys.items())]


def run_train(directory, name, options, launcher=(sys.executable,), timeout=300):
    """(out_dir, None) after a run of train.py as users run it, or (out_dir, why) when it failed."""
    out = os.path.join(directory, name)
    done = subprocess.run(train_argv(os.path.join(directory, "data"), out, options, launcher), cwd=directory,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return out, f"exit {done.returncode}: {lines[-1][:200] if lines else ''}"
    return out, None


def train_events(out_dir, kind="train"):
    import rundir
    return [e for e in rundir.read_events(out_dir) if e["event"] == kind]


def losses(out_dir):
    """{iteration: logged loss} (a resumed run's records follow the first part's in one log)."""
    return {e["iter"]: e["loss"] for e in train_events(out_dir)}


def mfu(tokens_per_sec, flops_per_token, peak):
    """Model FLOPs utilization: the model's training FLOPs per token (6N + attention's 12 L C T, as
    model.flops_per_token counts) times tokens per second, over the peak FLOP/s."""
    return tokens_per_sec * flops_per_token / peak


def throughput_rows(steps, flops_per_token, peak, name, skip_first=10):
    """tokens/s (median of the logged steps after the first skip_first: compile and warm-up) and MFU
    against the data sheet's dense bf16 peak (MFU_TARGET, a WARN when missed)."""
    rate = float(np.median([e["tokens_per_sec"] for e in steps[skip_first:]]))
    rows = [row("training", f"{name}: tokens/s", "info", f"{rate:,.0f}",
                f"median of {len(steps) - skip_first} steps after {skip_first}")]
    if not peak:
        return rows + [row("training", f"{name}: MFU", "skip", "no peak", "the card is not in model.PEAK_BF16_FLOPS")]
    value = mfu(rate, flops_per_token, peak)
    return rows + [speed("training", f"{name}: MFU", value >= MFU_TARGET, f"{100 * value:.1f}%",
                         f"{flops_per_token / 1e9:.3f} GFLOP/token x {rate:,.0f} tok/s / {peak / 1e12:.0f} TFLOP/s "
                         f"dense bf16 (data sheet); target >= {100 * MFU_TARGET:.0f}%")]


def flops_per_token(options):
    """model.flops_per_token of train.py's model for these keys, built on the meta device (no memory)."""
    import runtime
    cfg = runtime.resolve(dict(runtime.DEFAULTS, **dict(SMALL, **options)), 1)
    with torch.device("meta"):
        return runtime.build_model(cfg).flops_per_token()


def gpt2_speed_rows(directory, device):
    from model import peak_flops
    options = dict(GPT2, batch_size=16, gradient_accumulation_steps=1, compile=True, max_iters=40,
                   lr_decay_iters=40, warmup_iters=10, learning_rate=6e-4, eval_iters=1)
    out, failed = run_train(directory, "gpt2_compiled", options, timeout=500)
    name = "GPT-2 124M bf16 16 x 1024 compiled"
    if failed:
        return [row("training", name, "FAIL", "train.py failed", failed)]
    return throughput_rows(train_events(out), flops_per_token(options), peak_flops(device), name)


def parity_row(fp32, bf16, tail=PARITY_TAIL, tolerance=PARITY_TOLERANCE):
    """float32 against bfloat16: the mean loss of the last `tail` steps within `tolerance` nats."""
    a, b = (float(np.mean([run[i] for i in sorted(run)[-tail:]])) for run in (fp32, bf16))
    ok = math.isfinite(a) and math.isfinite(b) and abs(a - b) <= tolerance
    return correctness("training", f"float32 vs bfloat16 loss, {len(fp32)} steps", ok, f"{abs(a - b):.4f} nats",
                       f"mean of the last {tail}: float32 (TF32 matmuls) {a:.4f}, bfloat16 {b:.4f}; "
                       f"tolerance {tolerance}")


def parity_rows(directory):
    runs = {}
    for dtype in ("float32", "bfloat16"):
        out, failed = run_train(directory, f"parity_{dtype}", dict(dtype=dtype, max_iters=PARITY_STEPS,
                                                                   lr_decay_iters=PARITY_STEPS,
                                                                   warmup_iters=PARITY_STEPS // 10))
        if failed:
            return [row("training", "float32 vs bfloat16 loss", "FAIL", "train.py failed", f"{dtype}: {failed}")]
        runs[dtype] = losses(out)
    return [parity_row(runs["float32"], runs["bfloat16"])]


def head_rows(device, dtype="bfloat16", N=4096, C=768, V=50304):
    """Every training head (kernels.linear_cross_entropy) under autocast against the full head in
    float64: the loss and the gradients of the activations and the weight; 16-bit tolerance."""
    from kernels.linear_cross_entropy import CUDA_LIBRARIES, HEAD_LOSSES, linear_cross_entropy
    g = torch.Generator(device).manual_seed(0)
    x = torch.randn(N, C, device=device, generator=g)
    weight = 0.05 * torch.randn(V, C, device=device, generator=g)
    targets = torch.randint(0, V, (N,), device=device, generator=g)
    targets[::17] = -1  # some ignored positions, as padding gives
    ref_x, ref_w = x.double().requires_grad_(), weight.double().requires_grad_()
    ref = F.cross_entropy(F.linear(ref_x, ref_w), targets, ignore_index=-1)
    ref.backward()
    rows = []
    for head_loss in HEAD_LOSSES:
        package = CUDA_LIBRARIES.get(head_loss)
        name = f"head_loss={head_loss} vs float64 full head"
        if package and importlib.util.find_spec(package) is None:
            rows.append(row("training", name, "skip", "not installed", f"pip install {package.replace('_', '-')}"))
            continue
        if package and not device.startswith("cuda"):
            rows.append(row("training", name, "skip", "CUDA only", f"{package} runs Triton kernels on CUDA"))
            continue
        low_x, low_w = x.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast(device.split(":")[0], dtype=getattr(torch, dtype)):
            if head_loss == "full":  # the model's full head: logits, their float32 copy, cross_entropy
                loss = F.cross_entropy(F.linear(low_x, low_w).float(), targets, ignore_index=-1)
            else:
                loss = linear_cross_entropy(low_x, low_w, targets, head_loss, ignore_index=-1)
        loss.backward()
        errors = dict(loss=relative_error(loss, ref), dx=relative_error(low_x.grad, ref_x.grad),
                      dweight=relative_error(low_w.grad, ref_w.grad))
        _, value, _, where = worst([(head_loss, {k: (e, TOLERANCE[dtype]) for k, e in errors.items()})])
        rows.append(correctness("training", name, value <= TOLERANCE[dtype], f"{value:.1e}",
                                f"worst of loss, dx, dweight ({where}); {dtype} autocast, {N} tokens, vocab {V}; "
                                f"tolerance {TOLERANCE[dtype]:.0e}"))
    return rows


def step_timer_row(device, peak=True):
    """The eager GPT-2 124M step (8 x 1024, bf16) timed three ways: devices.DeviceTimer (what train.py logs)
    against CUDA events (the row's verdict), and the wall clock from an idle device to the step's last kernel
    (host launch overhead included: its detail); then the measured matmul peak against the data sheet."""
    import devices
    import runtime
    cfg = runtime.resolve(dict(runtime.DEFAULTS, **GPT2, batch_size=8, gradient_accumulation_steps=1,
                               dtype="bfloat16", device=device.split(":")[0]), 1)
    model = runtime.build_model(cfg).to(device)
    optimizer = model.configure_optimizers("adamw", 6e-4, 0.1, impl="fused")
    idx = torch.randint(0, cfg["vocab_size"], (cfg["batch_size"], cfg["block_size"]), device=device)
    _, autocast = devices.precision("bfloat16", device)

    def step():
        with autocast:
            _, loss = model(idx, idx)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    timer, timed, wall = devices.DeviceTimer(device), [], []

    def timed_step():
        devices.synchronize(device)
        began = time.perf_counter()
        timer.start()
        step()
        timed.append(1000 * timer.elapsed())  # waits for the step's last kernel
        wall.append(1000 * (time.perf_counter() - began))

    events = devices.device_ms(timed_step, repeats=10)
    ratio = float(np.median(timed[3:])) / events
    shape = f"{GPT2['n_layer']} layers, {cfg['batch_size']} x {cfg['block_size']}"
    rows = [correctness("training", "step time: DeviceTimer / CUDA events", 0.95 <= ratio <= 1.10, f"{ratio:.3f}",
                        f"median {np.median(timed[3:]):.1f} ms vs {events:.1f} ms; wall clock "
                        f"{np.median(wall[3:]):.1f} ms (launches included); GPT-2 eager, {shape}, bf16")]
    if not peak:
        return rows
    from model import peak_flops
    measured, listed = devices.matmul_peak_flops(device, "bfloat16"), peak_flops(device)
    return rows + [
        speed("training", "matmul peak: measured / data sheet", listed is not None and 0.4 <= measured / listed <= 1.05,
              f"{measured / listed:.2f}" if listed else "unlisted",
              f"{measured / 1e12:.0f} TFLOP/s measured (8192^3 bf16); "
              + (f"data sheet {listed / 1e12:.0f}" if listed else "not in model.PEAK_BF16_FLOPS: no MFU")),
    ]


def block_graphs(keys, device, dtype, model=None):
    """torch._dynamo.explain on the training forward of one block (layer 1) of a 2-layer model (COMPILE_MODEL, RA
    in every layer) with `keys`, under the dtype's autocast, as each block's forward is compiled
    (parallel.compile_model): {graphs, breaks, why (the break reasons), kernel (whether a graph calls the fused
    kernel's op)}. attn_impl='auto' measures its choices first, as train.py does."""
    import devices
    import ra_model
    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = ra_model.RAConfig(**{**(model or COMPILE_MODEL), "ra_pattern": "all", **keys})
    net = ra_model.RAGPT(cfg).to(device)
    _, autocast = devices.precision(dtype, device)
    if cfg.attn_impl == "auto":
        ra_model.measure_auto(net, 2, device, autocast)
    x = torch.randn(2, cfg.block_size, cfg.n_embd, device=device, requires_grad=True)
    with autocast:
        explained = torch._dynamo.explain(net.transformer.h[1])(x)
    why = "; ".join(dict.fromkeys(str(b.reason).splitlines()[0][:120] for b in explained.break_reasons))
    kernel = any("fused_forward" in graph.code for graph in explained.graphs)
    return dict(graphs=explained.graph_count, breaks=explained.graph_break_count, why=why, kernel=kernel)


def compile_rows(device, dtype="bfloat16", model=None):
    """One row per attention path (COMPILE_PATHS): a compiled block is one graph with no break, and the
    triton paths' graph calls the fused kernel (a fallback to SDPA is quiet inside a compiled call), or FAIL."""
    rows = []
    for name, keys in COMPILE_PATHS.items():
        found = block_graphs(keys, device, dtype, model)
        graphs, breaks = found["graphs"], found["breaks"]
        runs = "the fused kernel" if found["kernel"] else "SDPA"
        ok = graphs == 1 and breaks == 0 and (found["kernel"] or keys.get("attn_impl") != "triton")
        rows.append(correctness("training", f"compiled block: {name}", ok,
                                f"{graphs} graph{'s' * (graphs != 1)}, {breaks} break{'s' * (breaks != 1)}",
                                found["why"] or f"torch._dynamo.explain of one block's training forward, {dtype}"
                                + ("" if keys.get("ra_pattern") == "none" else f"; runs {runs}")))
    return rows


def ra_training_rows(directory):
    """The fused kernel inside the model, eager and compiled (no graph break: compile_rows): the loss falls."""
    rows = []
    for compiled in (False, True):
        name = f"train RA mix attn_impl=triton{', compiled' if compiled else ''}"
        out, failed = run_train(directory, f"ra_triton_{compiled}", dict(model_type="ra", ra_pattern="all",
                                                                          attn_impl="triton", compile=compiled))
        if failed:
            rows.append(row("training", name, "FAIL", "train.py failed", failed))
            continue
        run = losses(out)
        first, last = run[min(run)], run[max(run)]
        rows.append(correctness("training", name, math.isfinite(last) and last < first - 0.5,
                                f"loss {first:.2f} -> {last:.2f}", f"{len(run)} steps of the small model"))
    return rows


def auto_choice_row(records):
    """attn_impl='auto' (the checklist's attn_auto records): on a GPU every reciprocal call is timed both
    ways and runs the faster, never the slower one."""
    timed = [r for r in records if r["sdpa_ms"] is not None and r["fused_ms"] is not None]
    faster = lambda r: "triton" if r["fused_ms"] < r["sdpa_ms"] else "sdpa"
    ok = bool(records) and len(timed) == len(records) and all(r["impl"] == faster(r) for r in timed)
    measured = "; ".join(f"{r['mode']} T={r['q_shape'][2]}{' dropout' if r['dropout'] else ''}: {r['impl']}"
                         for r in records) or "no choice recorded"
    return correctness("training", "train RA mix attn_impl=auto: the faster path", ok, measured,
                       "; ".join(r["reason"] for r in records))


def ra_auto_rows(directory):
    out, failed = run_train(directory, "ra_auto", dict(model_type="ra", ra_pattern="all", attn_impl="auto"))
    if failed:
        return [row("training", "train RA mix attn_impl=auto", "FAIL", "train.py failed", failed)]
    return [auto_choice_row(train_events(out, "checklist")[0]["attn_auto"])]


def training_rows(directory, device):
    return (compile_rows(device) + gpt2_speed_rows(directory, device) + step_timer_row(device) + parity_rows(directory)
            + head_rows(device) + ra_training_rows(directory) + ra_auto_rows(directory))


# ----------------------------------------------------------------------------- memory

MEMORY_CASES = {
    "baseline": {},
    "RA mix, fused (triton)": dict(model_type="ra", ra_pattern="all", attn_impl="triton"),
    "RA mix, through SDPA": dict(model_type="ra", ra_pattern="all", attn_impl="sdpa"),
    "MLA": dict(model_type="ra", mla=True),
    "gated attention": dict(model_type="ra", attn_gate=True),
    "activation checkpointing": dict(activation_checkpointing=True),
}


def memory_row(name, estimate, step_peak, eval_peak, reserved_peak, reserve, margin=MEMORY_MARGIN):
    """The estimate (bytes, sharding.memory_estimate's dict) against what the allocator measured.
    FAIL when it is under the allocated peak (step, or step and evaluation) by more than `margin`: the
    pre-flight check would let through a run that does not fit; or over what the allocator reserved
    from the card by more than `margin`: the pre-flight refusal would refuse a run that fits. The
    estimate's GPU reserve is for workspaces outside the allocator's counts: compared without it."""
    step, total = estimate["step"] - reserve, estimate["total"] - reserve
    under = min(step / step_peak, total / max(step_peak, eval_peak))
    over = total / reserved_peak
    ok = under >= 1 - margin and over <= 1 + margin
    gib = lambda b: f"{b / 2**30:.2f}"
    return correctness("memory", f"memory estimate: {name}", ok, f"{under:.2f} / {over:.2f}",
                       f"estimate step {gib(step)} total {gib(total)} GiB (+{gib(reserve)} reserve) vs allocated "
                       f"step {gib(step_peak)} eval {gib(eval_peak)}, reserved {gib(reserved_peak)}; "
                       f"estimate/allocated >= {1 - margin:.2f}, estimate/reserved <= {1 + margin:.2f}")


def measure_memory(cfg, device, steps=2):
    """(step peak, evaluation peak, reserved peak) in bytes above what was allocated before: a few
    training steps as train.py takes them, then an evaluation forward (all logits of a batch)."""
    import devices
    import optim
    import runtime
    before = torch.cuda.memory_allocated(device)
    torch.manual_seed(0)
    model = runtime.build_model(cfg).to(device)
    optimizer = optim.build_optimizer(model, cfg)
    _, autocast = devices.precision(cfg["dtype"], device)
    x = torch.randint(0, cfg["vocab_size"], (cfg["batch_size"], cfg["block_size"]), device=device)
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(steps):
        with autocast:
            _, loss = model(x, x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    step_peak, reserved = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    model.eval()
    with torch.no_grad(), autocast:
        model(x, x)
    eval_peak = torch.cuda.max_memory_allocated(device)
    reserved = max(reserved, torch.cuda.max_memory_reserved(device))
    del model, optimizer, loss
    torch.cuda.empty_cache()
    return step_peak - before, eval_peak - before, reserved - before


def memory_rows(device):
    import runtime
    import sharding
    rows = []
    for name, options in MEMORY_CASES.items():
        cfg = runtime.resolve(dict(runtime.DEFAULTS, **GPT2, batch_size=8, gradient_accumulation_steps=1,
                                   dtype="bfloat16", device=device.split(":")[0], **options), 1)
        estimate = sharding.memory_estimate(cfg, runtime.count_params(cfg), 1, "bfloat16", "cuda")
        rows.append(memory_row(name, estimate, *measure_memory(cfg, device), sharding.RESERVE_BYTES))
    return rows


# ----------------------------------------------------------------------------- distributed

def resume_row(straight, resumed, name):
    """A run stopped, saved and resumed against the same run straight through: every logged loss
    equal, bit for bit."""
    differ = [i for i in straight if resumed.get(i) != straight[i]]
    ok = bool(straight) and set(resumed) == set(straight) and not differ
    return correctness("distributed", name, ok, "bitwise equal" if ok else f"{len(differ)} steps differ",
                       f"iterations {min(straight, default=0)}-{max(straight, default=0)}"
                       + (f"; first difference at {differ[0]}" if differ else ""))


def match_row(one, two, name, tolerance=DDP_TOLERANCE):
    """Two GPUs against one at the same global batch: every loss within `tolerance`."""
    common = sorted(set(one) & set(two))
    gap = max((abs(one[i] - two[i]) for i in common), default=float("inf"))
    return correctness("distributed", name, bool(common) and len(common) == len(one) and gap <= tolerance,
                       f"max |diff| {gap:.1e}", f"{len(common)} steps; tolerance {tolerance:.0e}")


def distributed_rows(directory, device_count, device="cuda"):
    """torchrun on one process (NCCL on a GPU): DDP and FSDP2 steps, DCP save and resume; DDP on 2
    GPUs against one where there are two."""
    one = TORCHRUN + ("--nproc_per_node=1",)
    rows = []
    for data_parallel in ("ddp", "fsdp"):
        out, failed = run_train(directory, f"torchrun_{data_parallel}", dict(data_parallel=data_parallel,
                                                                              max_iters=10, device=device), one)
        run = {} if failed else losses(out)
        ok = not failed and len(run) == 10 and all(math.isfinite(v) for v in run.values())
        rows.append(correctness("distributed", f"torchrun 1 process, data_parallel={data_parallel}", ok,
                                f"loss {run[1]:.2f} -> {run[10]:.2f}" if ok else "failed",
                                failed or "10 steps, finite losses"))
    # DCP: deterministic=True, so that any difference is the checkpoint's, not the GPU's noise
    common = dict(data_parallel="fsdp", deterministic=True, save_checkpoint=True, max_iters=20, lr_decay_iters=20,
                  eval_interval=10, device=device)
    straight, failed = run_train(directory, "dcp_straight", common, one)
    split, failed_split = run_train(directory, "dcp_split", dict(common, max_iters=10), one)
    if not (failed or failed_split):
        split, failed_split = run_train(directory, "dcp_split", dict(common, init_from="resume"), one)
    if failed or failed_split:
        rows.append(row("distributed", "FSDP2 DCP save and resume", "FAIL", "train.py failed", failed or failed_split))
    else:
        rows.append(resume_row(losses(straight), losses(split), "FSDP2 DCP save and resume, bit for bit"))
    name = "DDP on 2 GPUs vs 1, same global batch"
    if device_count < 2:
        return rows + [row("distributed", name, "skip", f"{device_count} GPU", "needs 2 GPUs")]
    batch = dict(dtype="float32", batch_size=4, gradient_accumulation_steps=2, max_iters=10, device=device)
    alone, failed = run_train(directory, "ddp_one", batch, one)
    pair, failed_pair = run_train(directory, "ddp_two", batch, TORCHRUN + ("--nproc_per_node=2",))
    if failed or failed_pair:
        return rows + [row("distributed", name, "FAIL", "train.py failed", failed or failed_pair)]
    return rows + [match_row(losses(alone), losses(pair), name)]


# ----------------------------------------------------------------------------- determinism

def bitwise_row(a, b, name, required):
    """Two identical runs' losses: equal bit for bit or not; a FAIL only where `required`."""
    differ = [i for i in a if b.get(i) != a[i]]
    equal = bool(a) and set(a) == set(b) and not differ
    gap = max((abs(a[i] - b[i]) for i in differ if i in b), default=0.0)
    measured = "bitwise equal" if equal else f"differ from iter {differ[0] if differ else '?'}"
    detail = f"{len(a)} steps" + ("" if equal else f", largest |diff| {gap:.1e}")
    if required:
        return correctness("determinism", name, equal, measured, detail)
    return row("determinism", name, "info", measured, detail + " (GPU kernels may sum in any order)")


def cost_row(plain_ms, deterministic_ms):
    ratio = deterministic_ms / plain_ms
    return row("determinism", "deterministic=True: step time cost", "info", f"{ratio:.2f}x",
               f"median {deterministic_ms:.1f} ms vs {plain_ms:.1f} ms per step")


def step_ms(out_dir, skip_first=5):
    """Median logged step time after the first steps (at most half of them: warm-up)."""
    times = [e["step_time_ms"] for e in train_events(out_dir)]
    return float(np.median(times[min(skip_first, len(times) // 2):]))


def determinism_rows(directory, device="cuda"):
    rows, runs = [], {}
    for deterministic in (False, True):
        for copy in (0, 1):
            out, failed = run_train(directory, f"repeat_{deterministic}_{copy}", dict(deterministic=deterministic,
                                                                                     device=device))
            if failed:
                return rows + [row("determinism", f"deterministic={deterministic} run", "FAIL", "train.py failed",
                                   failed)]
            runs[deterministic, copy] = out
    import rundir
    checklist = train_events(runs[True, 0], "checklist")
    recorded = (bool(checklist) and checklist[0].get("deterministic_algorithms") is True
                and rundir.read_run_info(runs[True, 0]).get("start", {}).get("deterministic_algorithms") is True)
    rows.append(bitwise_row(losses(runs[False, 0]), losses(runs[False, 1]), "two identical runs", required=False))
    rows.append(bitwise_row(losses(runs[True, 0]), losses(runs[True, 1]), "two runs with deterministic=True",
                            required=True))
    rows.append(correctness("determinism", "deterministic=True recorded", recorded, "recorded" if recorded else "missing",
                            "deterministic_algorithms in the checklist and run_info.json's start"))
    rows.append(cost_row(step_ms(runs[False, 0]), step_ms(runs[True, 0])))
    return rows


# ----------------------------------------------------------------------------- the command

# ----------------------------------------------------------------------------- the dry run

DRY_GPT2 = dict(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=256)  # the step timer's model
DRY_COMPILE_MODEL = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=64)


class HostEvent:
    """torch.cuda.Event on the host clock, for a dry run's timings (a CPU op finishes before it returns)."""

    def __init__(self, enable_timing=False):
        self.time = None

    def record(self, stream=None):
        self.time = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return 1000 * (end.time - self.time)


class dry_run_setup:
    """What --dry_run=True changes, restored on exit: the kernels under the Triton interpreter (TRITON_INTERPRET
    must be set before Triton is imported: a fresh process), TMA forced there (INTERPRET_TMA) so the EVEN + TMA
    rows run the descriptor loads, CUDA events on the host clock, a tiny GPT-2 and few timed repeats."""

    def __enter__(self):
        os.environ["TRITON_INTERPRET"] = "1"
        from kernels import ra_attention as ra
        if not ra.INTERPRET:
            raise configurator.ConfigError("--dry_run=True runs the kernels under the Triton interpreter, which Triton "
                                           "reads when it is imported: run it in a fresh process")
        global GPT2, TIMING
        self.saved = (GPT2, TIMING, ra.INTERPRET_TMA, torch.cuda.Event)
        GPT2, TIMING, ra.INTERPRET_TMA, torch.cuda.Event = DRY_GPT2, dict(repeats=1, warmup=0), True, HostEvent
        self.ra = ra
        return self

    def __exit__(self, *exc):
        global GPT2, TIMING
        GPT2, TIMING, self.ra.INTERPRET_TMA, torch.cuda.Event = self.saved


def dry_training_rows(device):
    """The training section's CPU-safe rows at tiny shapes: every compiled path's graphs, the step timer."""
    return (compile_rows(device, "float32", DRY_COMPILE_MODEL) + step_timer_row(device, peak=False)
            + [row("training", "train.py runs, MFU, parity, heads, auto", "skip", "dry run", "GPU only")])


def gpu_only_rows(section):
    return [row(section, f"{section} rows", "skip", "dry run", "GPU only")]


def section_checks(directory, device, dry_run):
    """{section: (function, *arguments)}: the GPU's sections, or a dry run's CPU-safe versions."""
    if dry_run:
        return dict(kernels=(kernel_rows, device, DRY_SHAPES), training=(dry_training_rows, device),
                    memory=(gpu_only_rows, "memory"), distributed=(gpu_only_rows, "distributed"),
                    determinism=(gpu_only_rows, "determinism"))
    return dict(kernels=(kernel_rows, device), training=(training_rows, directory, device),
                memory=(memory_rows, device), distributed=(distributed_rows, directory, torch.cuda.device_count()),
                determinism=(determinism_rows, directory))


# ----------------------------------------------------------------------------- the command

def main(argv):
    options, extra = configurator.options_and_paths(argv, OPTIONS, text_keys=("json", "only"))
    if extra:
        raise configurator.ConfigError(f"{extra[0]!r}: gpu_check.py takes only --json=PATH and --only=SECTIONS "
                                       f"(and --dry_run=True; --help)")
    if not options["json"]:
        raise configurator.ConfigError("--json='': name the file the rows are written to")
    chosen = sections_to_run(options["only"])
    if options["dry_run"]:
        with dry_run_setup():
            return run_sections(options, chosen, "cpu", "CPU (dry run: tiny shapes, Triton interpreter)")
    if not torch.cuda.is_available():
        print("gpu_check.py: no GPU is visible to PyTorch (torch.cuda.is_available() is False): nothing to check",
              file=sys.stderr)
        return 1
    return run_sections(options, chosen, "cuda:0", torch.cuda.get_device_name("cuda:0"))


def run_sections(options, chosen, device, name):
    """Runs the chosen sections, prints the table, writes the JSON; the exit status."""
    started = time.perf_counter()
    rows, section_seconds = [], {}
    with tempfile.TemporaryDirectory() as directory:
        toy_data(os.path.join(directory, "data"))
        checks = section_checks(directory, device, options["dry_run"])
        for section in chosen:
            fn, *args = checks[section]
            began = time.perf_counter()
            rows += guarded(section, fn, *args)
            section_seconds[section] = round(time.perf_counter() - began, 1)
            print(f"{section}: {section_seconds[section]:.0f} s", flush=True)
    seconds = time.perf_counter() - started
    print(f"{name}, torch {torch.__version__}, {seconds:.0f} s")
    print(table(rows))
    with open(options["json"], "w") as f:
        json.dump(dict(summary(rows, name, seconds, section_seconds), dry_run=options["dry_run"]), f, indent=1)
    print(f"wrote {options['json']}")
    return exit_status(rows)


if __name__ == "__main__":
    configurator.run_script(main)
