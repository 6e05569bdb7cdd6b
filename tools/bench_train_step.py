"""Benchmark of the baseline's whole training step (forward, backward, clipping, optimizer step)
with and without each speed and memory option, as ratios to the plain path measured in the same run.

    python tools/bench_train_step.py                                  # CPU twin shape: 6 layers, 384 wide, T=256, batch 8
    python tools/bench_train_step.py --preset=gpt2 --memory_only=True # GPT-2 124M, micro-batch 32, T=1024: peak memory only
    python tools/bench_train_step.py --preset=gpt2 --device=cuda --dtype=bfloat16 --options=plain,all,all_compiled
    python tools/bench_train_step.py --help                           # every key, its default and its meaning

Step options (STEP_OPTIONS, one row each): 'plain' is the step as it was before issue 15 (full
logits, torch's default optimizer loop, glibc's default malloc, eager, the loss and the gradient norm
read after every step); every other row changes what its name says. 'all' is train.py's defaults:
head_loss='auto' settled as train.py settles it (the full head on a GPU where the memory estimate
fits, chunked on CPUs), nothing read back until the end, blocks compiled one by one with 'all_compiled'.
Each row runs in a fresh process (its own allocator settings, its own peak memory) and measures
the machine's matmul peak for the dtype right before and after its steps (devices.matmul_peak_flops;
the higher counts): MFU = model FLOP/s / that peak, so a busy machine lowers both together. Time =
the median step of --steps after --warmup, each timed alone (the device drained before and after);
'in a row' = the --steps steps run back to back, timed together, as the training loop runs them (a
GPU then runs ahead of the host unless a row reads a value back every step); 'first s' = the first
warmup step, which compiles. --repeats cycles through all rows and keeps each row's fastest. Peak memory: CUDA max_memory_allocated; on CPU the peak of live tensor bytes over one step
(weights, gradients, optimizer states, activations, temporaries) by torch's MemTracker.
--memory_only=True runs that one step on fake tensors (FakeTensorMode: shapes and bytes, no arithmetic),
so GPT-2's micro-batch 32 x 1024 is measured on a laptop in seconds.
--profile=True runs one more step of each row under torch.profiler and splits its time by what the
ops do (PROFILE_CATEGORIES): the table says where the time that is not matmuls goes.
"""
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402
from tools import benchrows  # noqa: E402

# compile: False, 'blocks' (train.py's: parallel.compile_model) or 'whole' (torch.compile of the whole model)
PLAIN = dict(head_loss="full", optimizer_impl="", keep_freed_memory=False, compile=False, attn_impl="sdpa",
             read_every_step=True)
ALL = dict(head_loss="auto", optimizer_impl="fused", keep_freed_memory=True, read_every_step=False)  # train.py's defaults
STEP_OPTIONS = {
    "plain": {},
    "chunked_head": dict(head_loss="chunked"),
    "foreach_optimizer": dict(optimizer_impl="foreach"),
    "fused_optimizer": dict(optimizer_impl="fused"),
    "keep_freed_memory": dict(keep_freed_memory=True),
    "no_reads": dict(read_every_step=False),
    "all": ALL,
    "all_compiled": dict(ALL, compile="blocks"),
    "all_compiled_whole": dict(ALL, compile="whole"),  # the whole model in one graph, as before issue 49
    # one option at a time taken back from 'all': the full or the chunked head, reading the loss and the
    # gradient norm every step, or attention by hand (bf16 matmuls and a softmax instead of SDPA's CPU
    # flash kernel)
    "all_full_head": dict(ALL, head_loss="full"),
    "all_chunked_head": dict(ALL, head_loss="chunked"),
    "all_read_every_step": dict(ALL, read_every_step=True),
    "all_manual_attention": dict(ALL, attn_impl="manual"),
}
# --profile: each op's own (self) time goes to the first category whose rule matches the op's name
# or the name of a region it runs in; the step's time outside every op is Python and autograd.
MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
PROFILE_CATEGORIES = (
    ("optimizer (clip, AdamW)", lambda op, regions: any(r.startswith(("Optimizer.", "clip_grad_norm")) for r in regions)),
    ("matmuls", lambda op, regions: op in MATMULS),
    ("attention (SDPA)", lambda op, regions: "scaled_dot_product" in op),
    ("copies and casts", lambda op, regions: op in ("aten::copy_", "aten::_to_copy", "aten::clone")),
    ("softmax + cross-entropy", lambda op, regions: "softmax" in op or "nll_loss" in op
     or any("LinearCrossEntropy" in r for r in regions)),
    ("layernorm", lambda op, regions: "layer_norm" in op),
    ("gelu", lambda op, regions: "gelu" in op),
    ("embedding", lambda op, regions: "embedding" in op or "index_select" in op),
    ("fills and zeros", lambda op, regions: op in ("aten::fill_", "aten::zero_")),
    ("kernels fused by torch.compile", lambda op, regions: "CompiledFxGraph" in op),
    ("other ops (adds, bias grads, ...)", lambda op, regions: op.startswith("aten::")),
)
PRESETS = {
    "twin": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=50304, batch_size=8),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, batch_size=32),
}


# The tool's own keys; --help lists them, then benchrows.SHARED's (shape, device, warmup, steps, ...).
OPTIONS = dict(
    preset="twin",  # model shape: 'twin' (the CPU twin: 6 layers, 384 wide, T=256) or 'gpt2' (124M, T=1024, batch 32)
    options="",  # comma-separated step options, one row each (plain always runs; a wrong name lists them); '' all
    dtype="",  # 'float32', 'bfloat16' or 'float16'; '' picks the machine's best (devices.precision)
    memory_only=False,  # peak memory of one step on fake tensors, no timing
    profile=False,  # also split one step's time by op category (torch.profiler)
)


def parse_args(argv):
    """The keys as attributes, every mistake a ConfigError before any row runs; args.names are the
    step options to measure, plain first."""
    args = benchrows.parse(argv, OPTIONS, PRESETS, text_keys=("options",))
    names = benchrows.split_names(args.options, STEP_OPTIONS, "plain", "options")
    if args.memory_only:  # compiled graphs need real tensors; eager memory is what the options change
        if args.options and any(STEP_OPTIONS[n].get("compile") for n in names):
            raise configurator.ConfigError("--memory_only=True runs eager on fake tensors: leave compiled options "
                                           "out of --options")
        names = [n for n in names if not STEP_OPTIONS[n].get("compile")]
    args.names = names
    return args


def measure(args):
    """One row in this process: a dict with its step time, MFU and peak memory."""
    import torch

    import devices
    import messages
    import parallel
    import runtime
    import sharding
    from model import GPT, GPTConfig

    option = {**PLAIN, **STEP_OPTIONS[args.child]}
    device = parallel.pick_device(args.device)
    dtype, autocast = devices.precision(args.dtype, device)
    if option["keep_freed_memory"]:
        devices.keep_freed_memory()
    shape = {k: getattr(args, k) for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")}
    layout = parallel.ParallelLayout()
    layout.device = device
    cfg = runtime.settle(dict(runtime.DEFAULTS, **shape, batch_size=args.batch_size, gradient_accumulation_steps=1,
                              head_loss=option["head_loss"], device=device, dtype=dtype))
    head = sharding.choose_head_loss(cfg, layout, runtime.count_params(cfg), dtype)  # as train.py settles 'auto'
    head_loss, why = head.head_loss, messages.head_reason(head)
    fake = torch._subclasses.fake_tensor.FakeTensorMode() if args.memory_only else None
    with fake or torch.device(device):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**shape, head_loss=head_loss, attn_impl=option["attn_impl"]))
        optimizer = model.configure_optimizers("adamw", 6e-4, 0.1, impl=option["optimizer_impl"])
        idx = torch.randint(0, args.vocab_size, (args.batch_size, args.block_size))
    fwd_bwd = model
    if option["compile"] == "blocks":
        fwd_bwd = parallel.compile_model(model)
    elif option["compile"] == "whole":
        fwd_bwd = torch.compile(model)

    def step():  # train.py's step with one micro-batch
        with autocast:
            _, loss = fwd_bwd(idx, idx)
        loss.backward()
        with torch.profiler.record_function("clip_grad_norm"):
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if option["read_every_step"] and not args.memory_only:  # the host waits for the device (train.py before issue 49)
            loss.item(), grad_norm.item()

    result = dict(option=args.child, dtype=dtype, device=device, params=model.get_num_params(), head_loss=head_loss,
                  head_why=why)
    if args.memory_only:
        with fake:
            step()  # the optimizer's states exist from the first step on
            result.update(peak_mib=benchrows.peak_live_tensor_mib(step, model, optimizer),
                          memory="live tensor bytes on fake tensors")
        return result
    timer = devices.DeviceTimer(device)
    for i in range(args.warmup):
        timer.start()
        step()
        if i == 0:
            result["first_s"] = timer.elapsed()
    peak_flops = devices.matmul_peak_flops(device, dtype)
    times = benchrows.timed_steps(step, device, args.steps)
    timer.start()
    for _ in range(args.steps):
        step()
    result["in_a_row_ms"] = 1000 * timer.elapsed() / args.steps
    peak_flops = max(peak_flops, devices.matmul_peak_flops(device, dtype))
    if args.profile:  # before MemTracker: its global module hooks send a compiled model back to eager
        result["profile_ms"] = profile_by_category(step, device)
    if device.startswith("cuda"):
        peak, how = torch.cuda.max_memory_allocated(device) / 2**20, "CUDA max_memory_allocated"
    else:
        peak, how = benchrows.peak_live_tensor_mib(step, model, optimizer), "peak live tensor bytes (MemTracker)"
    step_time = statistics.median(times)
    tokens_per_s = args.batch_size * args.block_size / step_time
    return dict(result, step_ms=1000 * step_time, tokens_per_s=tokens_per_s, peak_mib=peak, memory=how,
                matmul_peak_gflops=peak_flops / 1e9, mfu=model.estimate_mfu(tokens_per_s, device, peak=peak_flops))


def profile_by_category(step, device):
    """{category: milliseconds} of one step(), in PROFILE_CATEGORIES' order, then the time outside ops.
    On a GPU each op's time is its kernels' device time (CPU time there is only the launches)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    import devices


    on_gpu = device.startswith("cuda")
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])) as prof:
        devices.synchronize(device)  # the wall time of the step, its launch gaps and host waits included
        started = time.perf_counter()
        step()
        devices.synchronize(device)
        wall = time.perf_counter() - started
    totals = dict.fromkeys([name for name, _ in PROFILE_CATEGORIES], 0.0)
    for event in prof.events():
        if event.device_type != DeviceType.CPU:  # a kernel: counted in the op that launched it
            continue
        regions, parent = [], event.cpu_parent
        while parent is not None:
            regions.append(parent.name)
            parent = parent.cpu_parent
        name = next((name for name, rule in PROFILE_CATEGORIES if rule(event.name, regions)), None)
        if name is not None:
            totals[name] += (event.self_device_time_total if on_gpu else event.self_cpu_time_total) / 1000
    totals["outside ops (Python, autograd)" if not on_gpu else "device idle (launch gaps, host syncs)"] = \
        max(0.0, 1000 * wall - sum(totals.values()))
    return totals


def print_profiles(results):
    names = list(results[0]["profile_ms"])
    print("\nwhere one profiled step's time goes, ms (share of the step)")
    width = max(20, 2 + max(len(r["option"]) for r in results))
    print(f"{'':<36}" + "".join(f"{r['option']:>{width}}" for r in results))
    for name in names + ["total"]:
        cells = []
        for r in results:
            ms = sum(r["profile_ms"].values()) if name == "total" else r["profile_ms"][name]
            cells.append(f"{ms:>12.0f} ({100 * ms / sum(r['profile_ms'].values()):>3.0f}%)")
        print(f"{name:<36}" + "".join(f"{c:>{width}}" for c in cells))


def main(argv):
    args = parse_args(argv)
    if args.child:
        print(json.dumps(measure(args)))
        return 0
    print(f"n_layer={args.n_layer} n_head={args.n_head} n_embd={args.n_embd} block_size={args.block_size} "
          f"vocab_size={args.vocab_size} batch_size={args.batch_size} steps={args.steps} (median), "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    runs = benchrows.run_rows(os.path.abspath(__file__), argv, args.names, args.repeats)
    if runs is None:
        return 1
    results = benchrows.fastest_with_ratios(runs)
    base = results[0]
    print(f"device={base['device']} dtype={base['dtype']} params={base['params']:,}; memory = {base['memory']}")
    if args.memory_only:
        print(f"{'option':<20}{'peak MiB':>10}{'mem x':>8}")
        for r in results:
            print(f"{r['option']:<20}{r['peak_mib']:>10.0f}{r['memory_ratio']:>8.2f}")
    else:
        print(f"{'option':<20}{'ms/step':>10}{'in a row':>10}{'first s':>9}{'tok/s':>10}{'peak GF/s':>10}{'MFU':>7}"
              f"{'peak MiB':>10}{'time x':>8}{'mem x':>8}  head")
        for r in results:
            print(f"{r['option']:<20}{r['step_ms']:>10.1f}{r['in_a_row_ms']:>10.1f}{r.get('first_s', float('nan')):>9.1f}"
                  f"{r['tokens_per_s']:>10,.0f}{r['matmul_peak_gflops']:>10.0f}{r['mfu']:>7.2f}{r['peak_mib']:>10.0f}"
                  f"{r['time_ratio']:>8.2f}{r['memory_ratio']:>8.2f}  {r['head_loss']}")
    if args.profile and not args.memory_only:
        print_profiles(results)
    if args.json:
        benchrows.write_json(args.json, args, results)
    return 0


if __name__ == "__main__":
    configurator.run_script(main)
