"""What fewer sync points save: every reduced-sync config trained for a few steps on tp_size ranks.

    torchrun --standalone --nproc_per_node=2 tools/bench_comm.py                 # small model, CPU (gloo)
    torchrun --standalone --nproc_per_node=2 tools/bench_comm.py --n_embd=768 --n_head=12 --block_size=1024 --batch_size=8
    torchrun --standalone --nproc_per_node=8 tools/bench_comm.py --n_embd=768 --n_head=12 --block_size=1024 --batch_size=8
    python tools/bench_comm.py --help                                            # every key, its default and its meaning

Per config (the block schedules of config/train_gpt2_*comm.py and train_*sync.py at a size set
here): median step time (forward, backward, gradient clipping, AdamW), the time inside
dist.all_reduce, the bytes all-reduced per step, and the speedup against all-TP (24comm) measured
in the same run. Then a projection from an alpha-beta ring all-reduce model, whose constants are
keys, for 8 GPUs on NVLink and for TP across 2 nodes on InfiniBand. All ranks form one tensor-
parallel group (no data parallelism here). Output: a table for people, and --json for scripts.
"""
import json
import os
import statistics
import sys
import time
import types

import torch
import torch.distributed as dist

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # a tool imports the workbench's modules from the repository root

import configurator  # noqa: E402
import parallel  # noqa: E402
import runtime  # noqa: E402
import sharding  # noqa: E402
from reduced_sync_model import REDUCED_SYNC_CONFIGS, SYNC_KEYS, ReducedSyncConfig, ReducedSyncGPT, expected_syncs  # noqa: E402

BASELINE = "train_gpt2_24comm"
OPTIONS = dict(
    # the model (12 layers, the configs' block schedules)
    n_embd=256,  # width of the residual stream
    n_head=8,  # attention heads: a multiple of the ranks (tp_size), dividing n_embd
    block_size=128,  # tokens per sequence
    batch_size=4,  # sequences per step
    vocab_size=4096,  # rows of the embedding and the head
    # what is measured
    steps=8,  # timed steps per config (median reported)
    warmup=2,  # untimed steps per config first
    only="",  # only the configs whose name contains this (the all-TP baseline always runs)
    json="",  # also write one JSON line per config here (rank 0)
    # the projection: an alpha-beta ring all-reduce per call
    nvlink_ranks=8,  # NVLink: tensor-parallel ranks
    nvlink_alpha_us=1.0,  # NVLink: latency per step of the ring, microseconds
    nvlink_beta_gbps=450.0,  # NVLink: bandwidth, GB/s per direction
    ib_ranks=2,  # InfiniBand: TP across this many nodes, one rank each
    ib_alpha_us=3.0,  # InfiniBand: latency per step of the ring, microseconds
    ib_beta_gbps=50.0,  # InfiniBand: bandwidth, GB/s per direction
    compute_ms=0.0,  # >0: project with this compute time per step (e.g. measured on the target GPUs), not all-TP's measured one
)


class AllReduceMeter:
    """Wraps dist.all_reduce (which reduced_sync_model calls) to time it and count its bytes; the
    device is synchronized around each call, so the time includes waiting for the slowest rank."""

    def __init__(self, device):
        self.device, self.original = device, dist.all_reduce
        self.reset()

    def reset(self):
        self.seconds, self.bytes, self.calls, self.sizes = 0.0, 0, 0, []

    def sync(self):
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)

    def __call__(self, tensor, *args, **kwargs):
        self.sync()
        t0 = time.perf_counter()
        result = self.original(tensor, *args, **kwargs)
        self.sync()
        self.seconds += time.perf_counter() - t0
        size = tensor.numel() * tensor.element_size()
        self.bytes, self.calls = self.bytes + size, self.calls + 1
        self.sizes.append(size)
        return result


def ring_allreduce_seconds(size, p, alpha, beta):
    """Ring all-reduce of `size` bytes on p ranks: 2(p-1) latency steps and 2(p-1)/p of the data
    through each link (docs/experiments.md, "Ring all-reduce cost model")."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * size / beta


def build(name, args, device):
    """The config's block schedule at the benchmark's size, sharded over all ranks, with AdamW."""
    cfg = configurator.apply_config(runtime.DEFAULTS, [os.path.join(REPO, "config", f"{name}.py")])
    config = ReducedSyncConfig(n_layer=cfg["n_layer"], n_head=args.n_head, n_embd=args.n_embd,
                               block_size=args.block_size, vocab_size=args.vocab_size,
                               **{k: cfg[k] for k in SYNC_KEYS if k != "tp_size"}, tp_size=dist.get_world_size())
    torch.manual_seed(0)
    model = ReducedSyncGPT(config, tp_group=dist.group.WORLD).to(device)
    return dict(name=name, config=config, model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4),
                steps=[], comm=[], bytes=0, sizes=[])


def timed_step(run, idx, meter):
    """One training step (forward, backward, clipping, AdamW); appends its time and all-reduce time."""
    meter.reset()
    meter.sync()
    dist.barrier()
    t0 = time.perf_counter()
    _, loss = run["model"](idx, idx)
    loss.backward()
    sharding.clip_grad_norm(run["model"], 1.0)
    run["optimizer"].step()
    run["optimizer"].zero_grad(set_to_none=True)
    meter.sync()
    run["steps"].append(time.perf_counter() - t0)
    run["comm"].append(meter.seconds)
    run["bytes"], run["sizes"] = meter.bytes, list(meter.sizes)


def summarize(run, device):
    # Every rank agrees on one number per quantity: the slowest rank's median sets the pace. The tensor
    # lives on the process group's device: NCCL reduces no CPU tensors.
    compute = [t - c for t, c in zip(run["steps"], run["comm"])]  # this rank's time outside all-reduce
    med = torch.tensor([statistics.median(x) for x in (run["steps"], run["comm"], compute)], dtype=torch.float64,
                       device=device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    counts = run["model"].metrics()
    return dict(config=run["name"], syncs_expected=expected_syncs(run["config"]), syncs_forward=counts["syncs_forward"],
                syncs_backward=counts["syncs_backward"], allreduce_calls_per_step=len(run["sizes"]),
                step_ms=1000 * med[0].item(), allreduce_ms=1000 * med[1].item(), compute_ms=1000 * med[2].item(),
                mib_per_step=run["bytes"] / 2**20, sizes=run["sizes"])


def projected_comm_ms(result, p, alpha_us, beta_gbps):
    return 1000 * sum(ring_allreduce_seconds(s, p, alpha_us * 1e-6, beta_gbps * 1e9) for s in result["sizes"])


def parse_args(argv):
    """The keys as attributes; every mistake a ConfigError, on every rank, before the process group."""
    options, extra = configurator.options_and_paths(argv, OPTIONS, text_keys=("only", "json"))
    if extra:
        raise configurator.ConfigError(f"{extra[0]!r}: tools/bench_comm.py takes only --key=value options (--help)")
    for keys, low, rule in (
            (("n_embd", "n_head", "block_size", "batch_size", "vocab_size", "steps", "nvlink_ranks", "ib_ranks"), 1,
             "a whole number >= 1"),
            (("nvlink_alpha_us", "nvlink_beta_gbps", "ib_alpha_us", "ib_beta_gbps"), 1e-12, "a number > 0"),
            (("warmup", "compute_ms"), 0, "0 or more")):
        bad = next((k for k in keys if options[k] < low), None)
        if bad:
            raise configurator.ConfigError(f"--{bad}={options[bad]}: use {rule}")
    world = int(os.environ.get("WORLD_SIZE", 1))
    if options["n_embd"] % options["n_head"]:
        raise configurator.ConfigError(f"--n_head={options['n_head']} must divide --n_embd={options['n_embd']}")
    if options["n_head"] % world:
        raise configurator.ConfigError(f"--n_head={options['n_head']} must be a multiple of the {world} ranks")
    if "RANK" not in os.environ:
        raise configurator.ConfigError("run under torchrun: torchrun --standalone --nproc_per_node=2 tools/bench_comm.py")
    return types.SimpleNamespace(**options)


def main(argv):
    args = parse_args(argv)
    device = f"cuda:{int(os.environ['LOCAL_RANK'])}" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    meter = AllReduceMeter(device)
    dist.all_reduce = meter  # reduced_sync_model calls dist.all_reduce through this module
    master = dist.get_rank() == 0
    try:
        names = [n for n in REDUCED_SYNC_CONFIGS if args.only in n]
        if BASELINE not in names:
            names.insert(0, BASELINE)
        runs = [build(name, args, device) for name in names]
        idx = torch.randint(0, args.vocab_size, (args.batch_size, args.block_size),
                            generator=torch.Generator().manual_seed(1)).to(device)
        # Round-robin over the configs, so that a busy moment of the machine hits them all alike.
        for step in range(args.warmup + args.steps):
            for run in runs:
                timed_step(run, idx, meter)
                if step < args.warmup:
                    run["steps"].clear()
                    run["comm"].clear()
        results = [summarize(run, device) for run in runs]
    finally:
        dist.all_reduce = meter.original
    if master:
        report(results, args, device)
    parallel.exit_distributed()


def report(results, args, device):
    base = next(r for r in results if r["config"] == BASELINE)
    nv = dict(p=args.nvlink_ranks, alpha_us=args.nvlink_alpha_us, beta_gbps=args.nvlink_beta_gbps)
    ib = dict(p=args.ib_ranks, alpha_us=args.ib_alpha_us, beta_gbps=args.ib_beta_gbps)
    for r in results:
        compute = args.compute_ms or base["compute_ms"]  # every config does the same matmuls
        r["nvlink_comm_ms"], r["ib_comm_ms"] = projected_comm_ms(r, **nv), projected_comm_ms(r, **ib)
        r["nvlink_step_ms"], r["ib_step_ms"] = compute + r["nvlink_comm_ms"], compute + r["ib_comm_ms"]
    world = dist.get_world_size()
    print(f"measured on {world} ranks ({device}, {'nccl' if device.startswith('cuda') else 'gloo'}): 12 layers, "
          f"n_embd {args.n_embd}, {args.n_head} heads, batch {args.batch_size} x {args.block_size} tokens, vocab "
          f"{args.vocab_size}; median of {args.steps} steps after {args.warmup} warm-up, configs interleaved step by step")
    head = (f"{'config':<22}{'syncs':>6}{'calls':>6}{'step ms':>9}{'a-r ms':>8}{'comp ms':>9}{'MiB/step':>9}"
            f"{'speedup':>8} | {'NVL comm':>9}{'step':>8}{'speedup':>8} | {'IB comm':>8}{'step':>8}{'speedup':>8}")
    print(head)
    print("-" * len(head))
    for r in results:
        print(f"{r['config'].removeprefix('train_'):<22}{r['syncs_forward']:>6}{r['allreduce_calls_per_step']:>6}"
              f"{r['step_ms']:>9.1f}{r['allreduce_ms']:>8.1f}{r['compute_ms']:>9.1f}{r['mib_per_step']:>9.2f}"
              f"{base['step_ms'] / r['step_ms']:>7.2f}x | {r['nvlink_comm_ms']:>9.3f}{r['nvlink_step_ms']:>8.1f}"
              f"{base['nvlink_step_ms'] / r['nvlink_step_ms']:>7.2f}x | {r['ib_comm_ms']:>8.3f}{r['ib_step_ms']:>8.1f}"
              f"{base['ib_step_ms'] / r['ib_step_ms']:>7.2f}x")
        assert r["syncs_forward"] == r["syncs_backward"] == r["syncs_expected"], r
    print(f"""
columns: syncs = model-internal all-reduces per forward pass (as many again backward); calls = all
all-reduces per training step (forward + backward + 1 scalar for the gradient norm); a-r ms = time
inside dist.all_reduce, waits for the other ranks included; comp ms = step time outside all-reduce;\neach is the slowest rank's median.
projected columns: comm = the step's all-reduces under the model below, step = compute + comm.
projection (alpha-beta ring all-reduce, t(S) = 2(p-1) alpha + 2(p-1)/p S / beta per call):
  NVLink: p={nv['p']}, alpha={nv['alpha_us']} us, beta={nv['beta_gbps']} GB/s;  IB: p={ib['p']}, alpha={ib['alpha_us']} us, \
beta={ib['beta_gbps']} GB/s
assumptions: every config does the same matmuls (same shapes, same FLOPs), so all share one compute
time per step, {'--compute_ms=%g' % args.compute_ms if args.compute_ms else "the all-TP config's measured comp ms"}, not rescaled for the device, the model
size or the tp degree p (the comp ms differences measured here are not carried over); the message
sizes are the measured ones (B x T x n_embd activations do not depend on p); all-reduces do not
overlap compute (tensor-parallel syncs sit on the critical path); no contention from data-parallel
traffic; every all-reduce is a ring over p ranks.""")
    if args.json:
        with open(args.json, "w") as f:
            for r in results:
                f.write(json.dumps({k: v for k, v in r.items() if k != "sizes"}) + "\n")


if __name__ == "__main__":
    configurator.run_script(main)
