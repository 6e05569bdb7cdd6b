"""Benchmark of RA mix's preparation: one attention layer (c_attn, the doubled operands, SDPA, c_proj), forward
+ backward, with c_attn's output laid out per head (the doubled key a view of it, the query the one copy: what
the model runs) against the concatenating path it replaced (q, k, v split as in the baseline, both doubled
operands copied), as a ratio measured in one run: the two paths alternate, the median of each is kept.

    python tools/bench_ra_layout.py                          # 12 heads of 64, T=256, batch 4, fp32
    python tools/bench_ra_layout.py --device=cuda --dtype=bfloat16 --B=8 --T=1024
    python tools/bench_ra_layout.py --help                   # every key, its default and its meaning
"""
import os
import statistics
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402

OPTIONS = dict(
    B=4,  # batch
    T=256,  # sequence length
    n_head=12,  # heads
    n_embd=768,  # width (head size n_embd // n_head)
    ra_window=0,  # >0: the windowed mix
    dtype="float32",  # 'float32', 'bfloat16' or 'float16' (autocast)
    device="",  # '' picks cuda when available
    warmup=3,  # untimed passes of each path first
    reps=20,  # timed passes of each path, alternating (the median is reported)
)


def parse_args(argv):
    options, extra = configurator.options_and_paths(argv, OPTIONS, text_keys=("dtype", "device"))
    if extra:
        raise configurator.ConfigError(f"{extra[0]!r}: tools/bench_ra_layout.py takes only --key=value options "
                                       "(--help)")
    if options["dtype"] not in ("float32", "bfloat16", "float16"):
        raise configurator.ConfigError(f"--dtype={options['dtype']!r}: use float32, bfloat16 or float16")
    for key in ("B", "T", "n_head", "n_embd", "reps"):
        if options[key] < 1:
            raise configurator.ConfigError(f"--{key}={options[key]}: use a whole number >= 1")
    return options


def measure(options):
    """{path: median ms of one forward + backward} for both preparations of one mix layer."""
    import devices
    import parallel
    from model import CausalSelfAttention
    from ra_model import RAAttention, RAConfig

    device = parallel.pick_device(options["device"])
    devices.check_dtype(options["dtype"], device)
    config = RAConfig(n_layer=1, n_head=options["n_head"], n_embd=options["n_embd"], block_size=options["T"],
                      ra_pattern="all", ra_mode="mix", ra_window=options["ra_window"])
    torch.manual_seed(0)
    attn = RAAttention(config, mode="mix").to(device)
    x = torch.randn(options["B"], options["T"], options["n_embd"], device=device, requires_grad=True)
    paths = {
        "concatenated": lambda: attn.c_proj(CausalSelfAttention.heads_output(attn, x)),  # the baseline's split
        "per_head": lambda: attn(x),
    }
    dtype = getattr(torch, options["dtype"])
    autocast = torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype != torch.float32)
    timer, times = devices.DeviceTimer(device), {name: [] for name in paths}
    for rep in range(options["warmup"] + options["reps"]):
        for name, forward in paths.items():
            timer.start()
            with autocast:
                y = forward()
            y.backward(torch.ones_like(y))
            seconds = timer.elapsed()
            if rep >= options["warmup"]:
                times[name].append(1000 * seconds)
    return {name: statistics.median(ms) for name, ms in times.items()}


def main(argv):
    options = parse_args(argv)
    ms = measure(options)
    print(f"RA mix layer, forward + backward: B={options['B']} T={options['T']} {options['n_head']} heads of "
          f"{options['n_embd'] // options['n_head']}, window {options['ra_window']}, {options['dtype']}, "
          f"median of {options['reps']}")
    for name, value in ms.items():
        print(f"  {name:<13} {value:9.3f} ms  {value / ms['concatenated']:.2f}x")


if __name__ == "__main__":
    configurator.run_script(main)
