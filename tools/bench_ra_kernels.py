"""Benchmark of causal attention variants at GPT-2 124M shapes: time and peak memory.

    python tools/bench_ra_kernels.py                      # B=8, H=12, D=64, bf16, T = 512 ... 8192
    python tools/bench_ra_kernels.py --T 1024 --json out.jsonl

Rows:
  sdpa               the baseline: F.scaled_dot_product_attention(q, k, v, is_causal=True)
  torch:<mode>       ra_model.reciprocal_sdpa, RA through SDPA: swap = sdpa(k, q, v); mix = one SDPA
                     call with doubled head size ([q, a k] . [k, q]); gate = two SDPA calls mixed by p
  reference:<mode>   ra_model.reciprocal_manual (materializes B x H x T x T scores)
  triton:<mode>      kernels.ra_attention.reciprocal_attention (fused kernels)
For each: forward time, forward+backward time (median over --reps, CUDA events), peak memory
above the inputs during forward+backward, and both times as ratios to sdpa at the same T.
Without a GPU it says so and exits 0.
"""

import argparse
import json

import os
import sys
import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

from kernels.ra_attention import reciprocal_attention  # noqa: E402
from ra_model import reciprocal_manual, reciprocal_sdpa  # noqa: E402

RA_MODES = ("swap", "mix", "gate")
ALPHA, GATE_LOGIT = 0.5, 0.0


def variants():
    yield "sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    p = torch.sigmoid(torch.tensor(GATE_LOGIT))  # the gate's weight of the reciprocal branch
    for name, fn in (("torch", reciprocal_sdpa), ("reference", reciprocal_manual)):
        for mode in RA_MODES:
            yield f"{name}:{mode}", lambda q, k, v, mode=mode, fn=fn: fn(q, k, v, mode, ALPHA, p.to(q.device), 0, 0.0)
    extra = {"mix": {"alpha": ALPHA}, "gate": {"gate_logit": GATE_LOGIT}, "swap": {}}
    for mode in RA_MODES:
        yield f"triton:{mode}", lambda q, k, v, mode=mode: reciprocal_attention(q, k, v, mode, **extra[mode])


def cuda_time_ms(fn, reps):
    for _ in range(3):  # warm-up (and Triton's autotuning on the first call)
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def measure(fn, q, k, v, reps):
    """(forward ms, forward+backward ms, peak MiB above the inputs) or None when out of memory."""
    def fwd():
        with torch.no_grad():
            fn(q, k, v)

    def fwd_bwd():
        fn(q, k, v).backward(do)
        q.grad = k.grad = v.grad = None

    do = torch.randn_like(q)
    try:
        t_fwd = cuda_time_ms(fwd, reps)
        t_both = cuda_time_ms(fwd_bwd, reps)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fwd_bwd()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    except torch.OutOfMemoryError:
        q.grad = k.grad = v.grad = None
        return None
    finally:
        torch.cuda.empty_cache()
    return t_fwd, t_both, peak


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--B", type=int, default=8)
    parser.add_argument("--H", type=int, default=12)
    parser.add_argument("--D", type=int, default=64)
    parser.add_argument("--T", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--only", nargs="*", default=None, help="variant names to run (default: all)")
    parser.add_argument("--json", default=None, help="also append one JSON line per measurement here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_ra: no GPU (torch.cuda.is_available() is False); nothing to measure.")
        return
    dtype = getattr(torch, args.dtype)
    device_name = torch.cuda.get_device_name()
    print(f"{device_name}  B={args.B} H={args.H} D={args.D} {args.dtype}")
    print(f"{'T':>6} {'variant':<18} {'fwd ms':>9} {'fwd+bwd ms':>11} {'peak MiB':>10} {'fwd x':>7} {'f+b x':>7}")
    for T in args.T:
        q, k, v = (torch.randn(args.B, args.H, T, args.D, device="cuda", dtype=dtype, requires_grad=True)
                   for _ in range(3))
        baseline = None
        for name, fn in variants():
            if args.only and name not in args.only and name != "sdpa":
                continue
            result = measure(fn, q, k, v, args.reps)
            if result is None:
                print(f"{T:>6} {name:<18} {'out of memory':>31}")
                row = {"T": T, "variant": name, "oom": True}
            else:
                t_fwd, t_both, peak = result
                baseline = baseline or (t_fwd, t_both)
                ratios = (t_fwd / baseline[0], t_both / baseline[1])
                print(f"{T:>6} {name:<18} {t_fwd:>9.3f} {t_both:>11.3f} {peak:>10.1f} {ratios[0]:>7.2f} {ratios[1]:>7.2f}")
                row = {"T": T, "variant": name, "fwd_ms": t_fwd, "fwd_bwd_ms": t_both, "peak_mib": peak,
                       "fwd_ratio": ratios[0], "fwd_bwd_ratio": ratios[1]}
            if args.json:
                row.update(device=device_name, B=args.B, H=args.H, D=args.D, dtype=args.dtype)
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
        del q, k, v


if __name__ == "__main__":
    main()
