"""The GPU self-check: one command for the first person with a GPU, under 10 minutes on one GPU.

    python gpu_check.py                   # prints one table, writes gpu_check.json
    python gpu_check.py --json=out.json
    python gpu_check.py --help            # this text and the keys

What the CPU test suite cannot see (it runs gloo, the Triton interpreter and no autocast on CUDA):
- the fused RA kernels against the float64 reference (ra_model.reciprocal_manual) in float32,
  bfloat16 and float16 at head sizes 64 and 128, forward and gradients, every mode;
- a few training steps of train.py (as a subprocess, as users run it) for each head_loss, each
  attention implementation, compile off and on: the loss must be finite and fall;
- a step timed by devices.DeviceTimer (what train.py logs) against CUDA events on the same steps;
- sharding.memory_estimate's step peak against torch.cuda.max_memory_allocated;
- which SDPA kernel runs, and the data-sheet peak MFU is against next to a measured matmul peak;
- the fused RA kernel's forward+backward time against SDPA's.
Each row says pass or FAIL; the exit status is 1 when any row failed. Without a GPU it says so in
one line and exits 1. Not part of the test suite: commit its output to docs/ (docs/kernels.md).
"""
import importlib.util
import json
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
OPTIONS = dict(
    json="gpu_check.json",  # where the rows are written
)
# Largest error against the float64 reference, relative to the reference's largest magnitude.
TOLERANCE = {"float32": 2e-3, "bfloat16": 3e-2, "float16": 5e-3}
TRAIN_RUNS = [dict(head_loss="full"), dict(head_loss="chunked"), dict(head_loss="liger"), dict(head_loss="cce"),
              dict(attn_impl="manual"), dict(model_type="ra", ra_pattern="all", attn_impl="triton"),
              dict(compile=True), dict(model_type="ra", ra_pattern="all", attn_impl="triton", compile=True)]


def row(check, passed, measured, detail=""):
    """passed: True, False, or None for a check that cannot run here (an optional package missing)."""
    return dict(check=check, passed=None if passed is None else bool(passed), measured=measured, detail=detail)


def ra_kernel_rows(device):
    """The fused kernel against reciprocal_manual in float64: forward and the three input gradients."""
    from kernels.ra_attention import reciprocal_attention
    from ra_model import reciprocal_manual
    rows = []
    for dtype in ("float32", "bfloat16", "float16"):
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means IEEE float32 here
        for D in (64, 128):
            worst = 0.0
            for mode, extra, alpha, p in (("swap", {}, 0.0, None), ("mix", {"alpha": 0.5}, 0.5, None),
                                          ("gate", {"gate_logit": 0.3}, 0.0, torch.sigmoid(torch.tensor(0.3)))):
                g = torch.Generator(device).manual_seed(0)
                q, k, v = (torch.randn(2, 4, 300, D, device=device, generator=g, dtype=torch.float64)
                           for _ in range(3))
                do = torch.randn(2, 4, 300, D, device=device, generator=g, dtype=torch.float64)
                ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
                ref = reciprocal_manual(*ref_in, mode, alpha, None if p is None else p.to(device, torch.float64), 0, 0.0)
                ref.backward(do)
                low = [t.to(getattr(torch, dtype)).requires_grad_() for t in (q, k, v)]
                out = reciprocal_attention(*low, mode, **extra)
                out.backward(do.to(out.dtype))
                for got, want in [(out, ref)] + [(a.grad, b.grad) for a, b in zip(low, ref_in)]:
                    worst = max(worst, ((got.double() - want).abs().max() / want.abs().max()).item())
            rows.append(row(f"RA kernel {dtype} D={D}", worst <= TOLERANCE[dtype], f"{worst:.1e}",
                            f"max error / max |reference|, forward and dq dk dv, modes swap mix gate; tolerance "
                            f"{TOLERANCE[dtype]:.0e}"))
    torch.backends.cuda.matmul.allow_tf32 = True
    return rows


def toy_data(directory):
    """A learnable token stream (noisy counting over 256 ids), as tests/conftest.py's."""
    import tokendata
    rng = np.random.default_rng(0)
    for split, n in (("train", 200_000), ("val", 20_000)):
        tokens = (np.arange(n) + (rng.random(n) < 0.1) * rng.integers(0, 256, n)) % 256
        tokendata.write_split(os.path.join(directory, f"{split}.bin"), [tokens])


def train_rows(directory):
    """train.py for a few steps per option, as a user runs it; the log's losses and step times."""
    import rundir
    from kernels.linear_cross_entropy import CUDA_LIBRARIES
    toy_data(directory)
    rows = []
    for i, option in enumerate(TRAIN_RUNS):
        out = os.path.join(directory, f"run{i}")
        argv = [sys.executable, os.path.join(REPO, "train.py"), f"--data_dir={directory}", f"--out_dir={out}",
                "--dataset=toy", "--vocab_size=256", "--n_layer=4", "--n_head=4", "--n_embd=256", "--block_size=256",
                "--batch_size=8", "--gradient_accumulation_steps=1", "--max_iters=30", "--lr_decay_iters=30",
                "--warmup_iters=5", "--learning_rate=3e-3", "--eval_interval=30", "--eval_iters=2", "--log_interval=1",
                "--dtype=bfloat16", "--save_checkpoint=False", *(f"--{k}={v}" for k, v in option.items())]
        name = "train " + ", ".join(f"{k}={v}" for k, v in option.items())
        package = CUDA_LIBRARIES.get(option.get("head_loss"))
        if package and importlib.util.find_spec(package) is None:
            rows.append(row(name, None, "not installed", f"pip install {package.replace('_', '-')} to check it"))
            continue
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if done.returncode:
            rows.append(row(name, False, "exit %d" % done.returncode, done.stderr.strip().splitlines()[-1][:160]
                            if done.stderr.strip() else ""))
            continue
        steps = [e for e in rundir.read_events(out) if e["event"] == "train"]
        first, last = steps[0]["loss"], steps[-1]["loss"]
        ms = np.median([e["step_time_ms"] for e in steps[5:]])
        rows.append(row(name, np.isfinite(last) and last < first - 0.5, f"loss {first:.2f} -> {last:.2f}",
                        f"{ms:.1f} ms/step (median after 5), {time.perf_counter() - started:.0f} s with start-up"))
    return rows


def step_timing_and_memory_rows(device):
    """One GPT-2-shaped training step: DeviceTimer against CUDA events, the memory estimate against
    the allocator's peak, the SDPA kernel, MFU's data-sheet peak against a measured matmul peak."""
    import devices
    import runtime
    import sharding
    from model import GPT, peak_flops
    cfg = dict(runtime.DEFAULTS, n_layer=12, n_head=12, n_embd=768, block_size=1024, batch_size=8,
               gradient_accumulation_steps=1, dtype="bfloat16")
    model = GPT(runtime.model_config(cfg)).to(device)
    optimizer = model.configure_optimizers("adamw", 6e-4, 0.1, impl="fused")
    idx = torch.randint(0, cfg["vocab_size"], (cfg["batch_size"], cfg["block_size"]), device=device)
    _, autocast = devices.precision("bfloat16", device)

    def step():
        with autocast:
            _, loss = model(idx, idx)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    timer, timed, events = devices.DeviceTimer(device), [], []
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        timer.start()
        start.record()
        step()
        end.record()
        timed.append(1000 * timer.elapsed())
        events.append(start.elapsed_time(end))
    peak = torch.cuda.max_memory_allocated(device)
    estimate = sharding.memory_estimate(cfg, runtime.count_params(cfg), 1, "bfloat16", "cuda")
    # the estimate's GPU reserve is for workspaces outside PyTorch's allocator counts: compare without it
    ratio = (estimate["step"] - sharding.RESERVE_BYTES) / peak
    timing = float(np.median(timed)) / float(np.median(events))
    measured = devices.matmul_peak_flops(device, "bfloat16")
    listed = peak_flops(device)
    backend = devices.sdpa_backend(device, "bfloat16", 12, 64, 1024)
    return [
        row("step time: DeviceTimer / CUDA events", 0.95 <= timing <= 1.10, f"{timing:.3f}",
            f"median {np.median(timed):.1f} ms vs {np.median(events):.1f} ms, GPT-2 124M, 8 x 1024, bf16"),
        row("memory estimate / max_memory_allocated", 0.75 <= ratio <= 1.25, f"{ratio:.2f}",
            f"estimate {estimate['step'] / 2**30:.2f} GiB (with a {sharding.RESERVE_BYTES / 2**30:.0f} GiB reserve), "
            f"allocator peak {peak / 2**30:.2f} GiB"),
        row("SDPA kernel (bf16, D=64, T=1024)", backend != "MATH", backend,
            "MATH materializes the scores: slow, and not what the memory estimate assumes"),
        row("matmul peak: measured / data sheet", listed is not None and 0.4 <= measured / listed <= 1.05,
            f"{measured / listed:.2f}" if listed else "unlisted",
            f"{measured / 1e12:.0f} TFLOP/s measured; {torch.cuda.get_device_name(device)!r} "
            + (f"lists {listed / 1e12:.0f}" if listed else "is not in model.PEAK_BF16_FLOPS: no MFU")),
    ]


def fused_speed_row(device):
    """The fused RA kernel (mix) against SDPA, forward + backward, bf16, GPT-2's attention shape."""
    import triton.testing
    from kernels.ra_attention import reciprocal_attention
    q, k, v = (torch.randn(8, 12, 1024, 64, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)

    def run(fn):
        return triton.testing.do_bench(lambda: torch.autograd.backward(fn(), do), grad_to_none=[q, k, v])

    sdpa = run(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    fused = run(lambda: reciprocal_attention(q, k, v, "mix", alpha=0.5))
    return row("fused RA (mix) / SDPA, fwd+bwd", fused / sdpa <= 4.0, f"{fused / sdpa:.2f}x",
               f"{fused:.2f} ms vs {sdpa:.2f} ms, 8 x 12 heads x 1024 x 64, bf16 (two streams of scores: ~2x is par)")


def main(argv):
    options, extra = configurator.options_and_paths(argv, OPTIONS, text_keys=("json",))
    if extra:
        raise configurator.ConfigError(f"{extra[0]!r}: gpu_check.py takes only --json=PATH (--help)")
    if not options["json"]:
        raise configurator.ConfigError("--json='': name the file the rows are written to")
    if not torch.cuda.is_available():
        print("gpu_check.py: no GPU is visible to PyTorch (torch.cuda.is_available() is False): nothing to check",
              file=sys.stderr)
        return 1
    device = "cuda:0"
    started = time.perf_counter()
    rows = ra_kernel_rows(device) + step_timing_and_memory_rows(device) + [fused_speed_row(device)]
    with tempfile.TemporaryDirectory() as directory:
        rows += train_rows(directory)
    name = torch.cuda.get_device_name(device)
    print(f"{name}, torch {torch.__version__}, {time.perf_counter() - started:.0f} s")
    width = max(len(r["check"]) for r in rows)
    print(f"{'check':<{width}}  {'':<4}  {'measured':<22}  detail")
    for r in rows:
        verdict = {True: "pass", False: "FAIL", None: "n/a"}[r["passed"]]
        print(f"{r['check']:<{width}}  {verdict:<4}  {r['measured']:<22}  {r['detail']}")
    with open(options["json"], "w") as f:
        json.dump(dict(device=name, torch=torch.__version__, hip=torch.version.hip, cuda=torch.version.cuda,
                       seconds=time.perf_counter() - started, rows=rows), f, indent=1)
    print(f"wrote {options['json']}")
    return 0 if all(r["passed"] is not False for r in rows) else 1


if __name__ == "__main__":
    configurator.run_script(main)
