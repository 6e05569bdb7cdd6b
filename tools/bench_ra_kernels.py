"""Benchmark of causal attention variants at GPT-2 124M shapes: time and peak memory.

    python tools/bench_ra_kernels.py                      # B=8, H=12, D=64, bf16, T = 512 ... 8192
    python tools/bench_ra_kernels.py --T=1024,4096 --json=out.jsonl
    python tools/bench_ra_kernels.py --only=triton:mix,torch:mix   # these rows (and sdpa, the baseline)
    python tools/bench_ra_kernels.py --help               # every key, its default and its meaning

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
import json
import os
import sys
import types

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402
import devices  # noqa: E402
from kernels.ra_attention import reciprocal_attention  # noqa: E402
from ra_model import reciprocal_manual, reciprocal_sdpa  # noqa: E402

RA_MODES = ("swap", "mix", "gate")
ALPHA, GATE_LOGIT = 0.5, 0.0
OPTIONS = dict(
    B=8,  # batch
    H=12,  # heads
    D=64,  # head size
    T="512,1024,2048,4096,8192",  # sequence lengths, comma-separated: one block of rows each
    dtype="bfloat16",  # 'bfloat16', 'float16' or 'float32'
    reps=10,  # timed calls per measurement (the median is reported)
    only="",  # comma-separated rows to run, e.g. 'triton:mix,torch:mix' (sdpa always runs); '' all
    json="",  # also append one JSON line per measurement here
)


def variants():
    yield "sdpa", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    p = torch.sigmoid(torch.tensor(GATE_LOGIT))  # the gate's weight of the reciprocal branch
    for name, fn in (("torch", reciprocal_sdpa), ("reference", reciprocal_manual)):
        for mode in RA_MODES:
            yield f"{name}:{mode}", lambda q, k, v, mode=mode, fn=fn: fn(q, k, v, mode, ALPHA, p.to(q.device), 0, 0.0)
    extra = {"mix": {"alpha": ALPHA}, "gate": {"gate_logit": GATE_LOGIT}, "swap": {}}
    for mode in RA_MODES:
        yield f"triton:{mode}", lambda q, k, v, mode=mode: reciprocal_attention(q, k, v, mode, **extra[mode])


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
        t_fwd = devices.device_ms(fwd, reps)
        t_both = devices.device_ms(fwd_bwd, reps)
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


def parse_args(argv):
    """The keys as attributes (T a list of ints, only a list of row names); every mistake a ConfigError."""
    options, extra = configurator.options_and_paths(argv, OPTIONS, text_keys=("T", "only", "json"))
    if extra:
        raise configurator.ConfigError(f"{extra[0]!r}: tools/bench_ra_kernels.py takes only --key=value options, "
                                       "e.g. --T=1024,4096 (--help)")
    lengths = options["T"].split(",")
    if not all(t.strip().isdigit() and int(t) > 0 for t in lengths):
        raise configurator.ConfigError(f"--T={options['T']}: comma-separated whole numbers, e.g. --T=1024,4096")
    options["T"] = [int(t) for t in lengths]
    for key in ("B", "H", "D", "reps"):
        if options[key] < 1:
            raise configurator.ConfigError(f"--{key}={options[key]}: use a whole number >= 1")
    if options["dtype"] not in ("bfloat16", "float16", "float32"):
        raise configurator.ConfigError(f"--dtype={options['dtype']!r}: use bfloat16, float16 or float32")
    known = [name for name, _ in variants()]
    options["only"] = [n for n in options["only"].split(",") if n]
    unknown = [n for n in options["only"] if n not in known]
    if unknown:
        raise configurator.ConfigError(f"--only: unknown rows {unknown}; use a comma list of {', '.join(known)}")
    return types.SimpleNamespace(**options)


def main(argv):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_ra_kernels: no GPU (torch.cuda.is_available() is False); nothing to measure.")
        return 0
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
    configurator.run_script(main)
