"""Benchmark of reciprocal attention and MLA against the baseline: forward+backward time per step,
tokens/s and peak memory of every variant, as ratios to the baseline measured in the same run.

    python tools/bench_ra_variants.py                                   # CPU, a small model (a few minutes on 2 cores)
    python tools/bench_ra_variants.py --preset=gpt2 --device=cuda --dtype=bfloat16 --batch_size=8   # GPT-2 124M, T=1024
    python tools/bench_ra_variants.py --variants=baseline,ra_late_mix,ralearn --steps=20
    python tools/bench_ra_variants.py --help                            # every key, its default and its meaning

Each variant runs in a fresh process, so one variant's allocations cannot raise another's peak.
Peak memory on CUDA: torch.cuda.max_memory_allocated over the timed steps (weights, gradients,
activations and temporaries). On CPU, where the allocator keeps no statistics (and tracemalloc
cannot see torch's allocations): the peak of live tensor bytes (the same categories) over one
forward+backward, counted by torch's MemTracker (torch.distributed._tools); if that private tool
is missing, the growth of the process's peak RSS over the steps, which is much noisier. Step
times on a shared CPU are noisy too: --repeats=3 cycles through all variants three times and keeps
each variant's fastest median. Targets of issue 4 at GPT-2 124M width and T=1024:
swap patterns within 1.05x of the baseline's step time, mix within 1.3x, RALEARN within 1.6x, every
variant within 1.3x of the baseline's peak memory.
"""
import json
import os
import resource
import statistics
import sys
import types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402
from tools import benchrows  # noqa: E402

# name -> RAConfig overrides. The baseline is the same class with ra_pattern='none' (exactly GPT).
VARIANTS = {
    "baseline": dict(ra_pattern="none"),
    **{f"ra_{pattern}_{mode}": dict(ra_pattern=pattern, ra_mode=mode)
       for mode in ("swap", "mix") for pattern in ("early", "late", "all", "alternate")},
    "ra_all_mix_window": dict(ra_pattern="all", ra_mode="mix", ra_window=-1),  # -1: --ra_window
    "ralearn": dict(ra_pattern="learned"),
    "mla": dict(mla=True),
    # config/train_ra_mla.py: the windowed mix keeps doubled and duplicated operands for backward,
    # which attn_recompute drops; the second row shows what that saves and costs.
    "ra_mla": dict(mla=True, ra_pattern="all", ra_mode="mix", ra_alpha=0.5, ra_window=-1, attn_recompute=True),
    "ra_mla_no_recompute": dict(mla=True, ra_pattern="all", ra_mode="mix", ra_alpha=0.5, ra_window=-1),
}
PRESETS = {
    "small": dict(n_layer=4, n_head=4, n_embd=128, block_size=256, vocab_size=4096, batch_size=4),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, batch_size=8),
}
# The tool's own keys; --help lists them, then benchrows.SHARED's (shape, device, warmup, steps, ...).
OPTIONS = dict(
    preset="small",  # model shape: 'small' (4 layers, 128 wide, T=256) or 'gpt2' (124M, T=1024); shape keys override it
    variants="",  # comma-separated variant names (baseline always runs; a wrong name lists them); '' runs all
    mla_latent_dim=0,  # 0: n_embd // 6 (128 at GPT-2 width)
    ra_window=64,  # window of the *_window and ra_mla variants
    attn_impl="sdpa",  # 'sdpa' or 'manual'
    dtype="float32",  # 'float32', 'bfloat16' or 'float16' (autocast; float16 needs a GPU)
    compile=False,  # torch.compile each variant (compiled during warmup)
    in_process=False,  # measure every variant in this process (quicker, less isolated)
)


def parse_args(argv):
    """The keys as attributes, every mistake a ConfigError before any variant runs; args.names are
    the variants to measure, baseline first."""
    args = benchrows.parse(argv, OPTIONS, PRESETS, text_keys=("variants",))
    if args.attn_impl not in ("sdpa", "manual"):
        raise configurator.ConfigError(f"--attn_impl={args.attn_impl!r}: use sdpa or manual")
    if not args.dtype:
        raise configurator.ConfigError("--dtype='': name one of float32, bfloat16, float16")
    args.mla_latent_dim = args.mla_latent_dim or args.n_embd // 6
    args.names = benchrows.split_names(args.variants, VARIANTS, "baseline", "variants")
    return args


def measure(args):
    """One variant in this process: a JSON line with its step time and peak memory."""
    import torch

    import devices
    import parallel
    from ra_model import RAConfig, RAGPT

    device = parallel.pick_device(args.device)
    overrides = {k: (args.ra_window if k == "ra_window" else v) for k, v in VARIANTS[args.child].items()}
    torch.manual_seed(0)
    config = RAConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size,
                      vocab_size=args.vocab_size, attn_impl=args.attn_impl, mla_latent_dim=args.mla_latent_dim,
                      **overrides)
    model = RAGPT(config).to(device)
    fwd_bwd = torch.compile(model) if args.compile else model
    idx = torch.randint(0, args.vocab_size, (args.batch_size, args.block_size), device=device)
    dtype = getattr(torch, args.dtype)
    autocast = torch.autocast(device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32)

    def step():
        with autocast:
            _, loss = fwd_bwd(idx, idx)
        loss.backward()
        model.zero_grad(set_to_none=True)
        devices.synchronize(device)

    rss_model = current_rss_mib()  # after the weights were allocated, before any step
    for _ in range(args.warmup):
        step()
    times = benchrows.timed_steps(step, device, args.steps)
    if device.startswith("cuda"):
        peak, how = torch.cuda.max_memory_allocated(device) / 2**20, "CUDA max_memory_allocated"
    else:
        peak, how = benchrows.peak_live_tensor_mib(step, model), "peak live tensor bytes (MemTracker)"
        if peak is None:  # ru_maxrss: the process's peak, warmup included; its growth since the model
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10 - rss_model
            how = "peak RSS growth over the steps (weights excluded)"
    step_time = statistics.median(times)
    return dict(variant=args.child, step_ms=1000 * step_time,
                tokens_per_s=args.batch_size * args.block_size / step_time, peak_mib=peak, memory=how,
                params=model.get_num_params(), device=device)


def current_rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv):
    args = parse_args(argv)
    if args.child:
        print(json.dumps(measure(args)))
        return 0
    names = args.names
    print(f"n_layer={args.n_layer} n_head={args.n_head} n_embd={args.n_embd} block_size={args.block_size} "
          f"vocab_size={args.vocab_size} batch_size={args.batch_size} dtype={args.dtype} attn_impl={args.attn_impl} "
          f"mla_latent_dim={args.mla_latent_dim} ra_window={args.ra_window} steps={args.steps} (median)")
    here = (lambda name: measure(types.SimpleNamespace(**{**vars(args), "child": name}))) if args.in_process else None
    runs = benchrows.run_rows(os.path.abspath(__file__), argv, names, args.repeats, here)
    if runs is None:
        return 1
    results = benchrows.fastest_with_ratios(runs)
    base = results[0]
    print(f"device={base['device']}; memory = {base['memory']}; time = fastest of {args.repeats} repeat(s)")
    print(f"{'variant':<20}{'params':>12}{'ms/step':>10}{'tok/s':>10}{'peak MiB':>10}{'time x':>8}{'mem x':>8}")
    for r in results:
        print(f"{r['variant']:<20}{r['params']:>12,}{r['step_ms']:>10.1f}{r['tokens_per_s']:>10,.0f}"
              f"{r['peak_mib']:>10.1f}{r['time_ratio']:>8.2f}{r['memory_ratio']:>8.2f}")
    if args.json:
        benchrows.write_json(args.json, args, results)
    return 0


if __name__ == "__main__":
    configurator.run_script(main)
