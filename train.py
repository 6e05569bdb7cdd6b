"""One training loop for every experiment, on one process or under torchrun.

    python train.py config/train_shakespeare.py
    python train.py config/train_gpt2.py --batch_size=16 --gradient_accumulation_steps=8
    torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2.py
    python train.py config/train_gpt2.py --init_from=resume

Every key of runtime.DEFAULTS can be set by a config file or a --key=value override (see
configurator.py).
A run directory (out_dir) receives config.json, log.jsonl (one JSON object per event), log.txt
(the same, for people) and ckpt.pt (everything needed to continue exactly where it stopped), or
with data_parallel='fsdp' / 'hsdp' the sharded checkpoint directory dcp/ (sharding.py).
"""
import json
import math
import os
import resource
import signal
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import configurator
import evaluation
import optim
import rundir
import runrecord
import sharding
import tokendata
from model import GPTConfig, model_config_fields
from runtime import (DEFAULTS, RankStalled, build_model, data_dir_of, decay_iters, exit_distributed, get_batch,
                     keep_freed_memory, last_iter, load_checkpoint, matmul_peak_flops, model_classes, model_config,
                     name_stalled_ranks, parallel_layout, precision, setup_distributed, validate)

REPO_DIR = os.path.dirname(os.path.abspath(__file__))
EVAL_SEED = 20240229  # fixed: the evaluation windows never depend on the run's seed


class TrainingDiverged(RuntimeError):
    pass


class Interrupted(Exception):
    """A second SIGINT/SIGTERM: the run stops at once, with the shell's exit code for that signal."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.exit_code = 128 + signum


EXIT_STOPPED_BY_SIGNAL = 3  # a first signal: the step finished, a checkpoint was written, resume to go on


# ----------------------------------------------------------------------------- data

def check_data(cfg):
    """Token counts of both splits; a missing, damaged or too small dataset, or one with ids
    beyond vocab_size, fails here with the fix."""
    data_dir = data_dir_of(cfg)
    prepare = f"prepare it again with `python data/{cfg['dataset']}/prepare.py`"
    itemsize = np.dtype(tokendata.TOKEN_DTYPE).itemsize
    for split in ("train", "val"):
        path = os.path.join(data_dir, f"{split}.bin")
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} not found: prepare the dataset first with "
                f"`python data/{cfg['dataset']}/prepare.py` (or point data_dir at a prepared directory)")
        size = os.path.getsize(path)
        if size % itemsize:
            raise configurator.ConfigError(f"{path} has {size} bytes, not a whole number of {itemsize}-byte "
                                           f"tokens: the file is truncated or not a token file; {prepare}")
        if size == 0:
            raise configurator.ConfigError(f"{path} is empty: {prepare}")
    counts = {split: tokendata.split_num_tokens(data_dir, split) for split in ("train", "val")}
    for split, n in counts.items():
        if n < cfg["block_size"] + 1:
            raise configurator.ConfigError(
                f"block_size={cfg['block_size']} needs at least {cfg['block_size'] + 1} tokens, "
                f"but {split}.bin has {n}: lower block_size")
    if cfg["batch_size"] * cfg["block_size"] > counts["train"]:
        raise configurator.ConfigError(
            f"one micro-batch (batch_size {cfg['batch_size']} x block_size {cfg['block_size']}) is larger "
            f"than the whole train split ({counts['train']} tokens): lower batch_size")
    vocab = tokendata.read_meta(data_dir).get("vocab_size", 0)
    if vocab > cfg["vocab_size"]:
        raise configurator.ConfigError(f"the dataset uses {vocab} token ids but vocab_size={cfg['vocab_size']}")
    # An id >= vocab_size would index past the embedding: garbage on a CPU, a device-side assert on a GPU.
    for split, top in tokendata.max_token_id(data_dir).items():
        if top >= cfg["vocab_size"]:
            raise configurator.ConfigError(f"{data_dir}/{split}.bin holds token id {top} but vocab_size="
                                           f"{cfg['vocab_size']}: set vocab_size above {top} or {prepare}")
    return data_dir, counts


def train_offsets(cfg, n_tokens, iter_num, global_micro_step):
    """Random windows drawn from a seed of (seed, iteration, global micro-step), so the data
    position is just the iteration number (exact resume) and 2 ranks x 2 micro-steps read the
    same batches as 1 process x 4 micro-steps."""
    rng = np.random.default_rng([cfg["seed"], iter_num, global_micro_step])
    return rng.integers(0, n_tokens - cfg["block_size"], size=cfg["batch_size"])


def eval_offsets(cfg, n_tokens):
    """Evenly spaced windows over the split, shuffled once with a fixed seed into eval_iters
    batches: identical in every run with the same batch and block size."""
    n = cfg["eval_iters"] * cfg["batch_size"]
    offsets = np.linspace(0, n_tokens - cfg["block_size"] - 1, n).astype(np.int64)
    np.random.default_rng(EVAL_SEED).shuffle(offsets)
    return offsets.reshape(cfg["eval_iters"], cfg["batch_size"])


# ----------------------------------------------------------------------------- schedule and metrics

def learning_rate_at(cfg, it):
    lr, min_lr, warmup = cfg["learning_rate"], cfg["min_lr"], cfg["warmup_iters"]
    if it < warmup:
        return lr * (it + 1) / warmup
    if cfg["lr_schedule"] == "constant":
        return lr
    end = decay_iters(cfg)
    if it >= end:
        return min_lr
    if cfg["lr_schedule"] == "cosine":
        progress = (it - warmup) / max(1, end - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
    decay_start = end - int(cfg["wsd_decay_frac"] * end)
    if it < decay_start:
        return lr
    return lr - (lr - min_lr) * (it - decay_start) / max(1, end - decay_start)


def peak_memory_mib(device):
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # Linux reports KiB


class ActivationNorms:
    """Forward hooks that keep the RMS of the residual stream after chosen layers, from the latest
    micro-step. A reduced_sync model has the whole stream only at its sync points: a layer inside a
    parallel run is measured after the run's last layer (the start-up checklist lists them)."""

    def __init__(self, model, layers):
        self.latest = {}
        n = len(model.transformer.h)
        self.layers = sorted({model.residual_layer(l % n) for l in layers})
        for layer in self.layers:
            model.residual_module(layer).register_forward_hook(self.hook(layer))

    def hook(self, layer):
        def record(module, inputs, output):
            self.latest[layer] = output.detach().float().pow(2).mean().sqrt()
        return record

    def read(self):
        return {f"act_rms_layer{l}": v.item() for l, v in sorted(self.latest.items())}


class RunLog:
    """log.jsonl for scripts, log.txt and the console for people, W&B when asked (master only).

    Records are strict JSON (a NaN is written as null). A torn last line left by a kill or a full
    disk is cut off before appending, so no record is ever glued to a fragment. Files are written
    unbuffered: a failed write raises at once, with its cause, and leaves nothing to flush later."""

    def __init__(self, cfg, master):
        self.master = master
        self.wandb = None
        if not master:
            return
        os.makedirs(cfg["out_dir"], exist_ok=True)
        torn = {name: rundir.repair_torn_line(os.path.join(cfg["out_dir"], name)) for name in ("log.jsonl", "log.txt")}
        self.jsonl = open(os.path.join(cfg["out_dir"], "log.jsonl"), "ab", buffering=0)
        self.text = open(os.path.join(cfg["out_dir"], "log.txt"), "ab", buffering=0)
        if torn["log.jsonl"]:
            self.event("log_repaired", f"cut a torn last line off log.jsonl ({len(torn['log.jsonl'])} characters "
                       f"of an unfinished record)", torn=torn["log.jsonl"][:200])
        if cfg["wandb_log"]:
            import wandb
            mode = cfg["wandb_mode"] or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
            self.wandb = wandb.init(project=cfg["wandb_project"], config=cfg, mode=mode, dir=cfg["out_dir"],
                                    name=cfg["wandb_run_name"] or os.path.basename(os.path.abspath(cfg["out_dir"])),
                                    group=cfg["wandb_group"] or None)

    def event(self, kind, line, **fields):
        if not self.master:
            return
        record = {"event": kind, "time": time.time(), **fields}
        self.write(self.jsonl, rundir.strict_json(record) + "\n")
        self.say(line)
        if self.wandb is not None and "iter" in fields:
            numbers = {f"{kind}/{k}": v for k, v in fields.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "iter"}
            self.wandb.log(numbers, step=fields["iter"])

    def say(self, line):
        if not self.master:
            return
        print(line, flush=True)
        self.write(self.text, line + "\n")

    @staticmethod
    def write(f, text):
        data = text.encode()
        try:
            while data:  # an unbuffered write may be partial (a disk filling up): write the rest or fail
                data = data[f.write(data):]
        except OSError as e:
            raise rundir.RunDirError(rundir.describe_write_error(
                e, f.name, "the run stopped there; ckpt.pt holds the last checkpoint (resume with "
                "--init_from=resume once there is room)")) from None

    def close(self):
        if self.master:
            self.jsonl.close()
            self.text.close()
            if self.wandb is not None:
                self.wandb.finish()


# ----------------------------------------------------------------------------- evaluation and checkpoints

@torch.no_grad()
def evaluate(model, cfg, env, data_dir, counts, autocast):
    """Mean loss over the fixed windows of each split; batches are shared out across ranks."""
    model.eval()
    losses = {}
    for split in ("train", "val"):
        total = torch.zeros(2, device=env["device"])  # loss sum, batch count
        batches = eval_offsets(cfg, counts[split])
        for first in range(0, len(batches), env["dp_size"]):
            k = first + env["dp_rank"]  # a replica's tensor-parallel ranks share each batch
            counted = k < len(batches)
            # A sharded model all-gathers in every forward, so every rank must run as many: a rank with
            # no batch left in the last round recomputes batch 0 without counting it.
            if not counted and env["mesh"] is None:
                continue
            x, y = get_batch(data_dir, split, batches[k if counted else 0], cfg["block_size"], env["device"])
            with autocast:
                _, loss = model(x, y)
            total += float(counted) * torch.stack([loss.float(), torch.ones((), device=env["device"])])
        if env["ddp"]:
            dist.all_reduce(total)
        losses[split] = (total[0] / total[1]).item()
    model.train()
    return losses


def model_and_optimizer_states(model, optimizer, env):
    """What a checkpoint stores. A tensor-parallel model is gathered into its full (GPT-layout)
    weights; the optimizer state stays sharded, a list with one state per tp rank (collective:
    every rank calls this)."""
    if env["tp_group"] is None:
        return model.state_dict(), optimizer.state_dict()
    group = env["tp_group"]
    states = [None] * dist.get_world_size(group) if dist.get_rank(group) == 0 else None
    dist.gather_object(optimizer.state_dict(), states, dst=dist.get_global_rank(group, 0), group=group)
    return model.full_state_dict(), states


def optimizer_state_of(checkpoint, env):
    """This rank's optimizer state; a sharded (list) state resumes only on the same tp layout."""
    state, tp_group = checkpoint["optimizer"], env["tp_group"]
    if isinstance(state, list) != (tp_group is not None):
        raise configurator.ConfigError(
            "the checkpoint's optimizer state was written " + ("by tensor-parallel ranks" if isinstance(state, list)
                                                                else "without tensor parallelism")
            + ": resume with the same torchrun layout (world size and tp_size)")
    return state[env["tp_rank"]] if tp_group is not None else state


def clip_grad_norm(model, max_norm, env):
    """The whole model's gradient norm, clipped; FSDP's and real tensor-parallel ranks' pieces are
    summed across the ranks that split them (sharding.clip_grad_norm)."""
    if env["mesh"] is None and env["tp_group"] is None:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return sharding.clip_grad_norm(model, max_norm, env["mesh"].get_group("shard") if env["mesh"] is not None else None)


def rng_state(device):
    state = {"torch": torch.get_rng_state()}
    if device.startswith("cuda"):
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state, device):
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.startswith("cuda"):
        torch.cuda.set_rng_state(state["cuda"], device)


def gathered_rng_states(env):
    """Every rank's RNG state (dropout masks differ per rank), collected on all ranks."""
    own = rng_state(env["device"])
    if not env["ddp"]:
        return [own]
    states = [None] * env["world_size"]
    dist.all_gather_object(states, own)
    return states


# ----------------------------------------------------------------------------- the run

def startup_checklist(cfg, env, model, counts, data_dir, dtype, tokens_per_iter, grad_accum_local):
    budget = last_iter(cfg) * tokens_per_iter
    return {
        "dataset": cfg["dataset"], "data_dir": data_dir,
        "train_tokens": counts["train"], "val_tokens": counts["val"],
        "model_class": type(model).__name__, "parameters": model.get_num_params(),
        "block_size": cfg["block_size"], "micro_batch": cfg["batch_size"],
        "grad_accum_steps": cfg["gradient_accumulation_steps"], "grad_accum_per_rank": grad_accum_local,
        "world_size": env["world_size"],
        "effective_batch_sequences": cfg["batch_size"] * cfg["gradient_accumulation_steps"],
        "tokens_per_iter": tokens_per_iter, "token_budget": budget,
        "max_iters": cfg["max_iters"], "max_time": cfg["max_time"], "max_tokens": cfg["max_tokens"],
        "dtype": dtype, "compile": cfg["compile"], "attn_impl": cfg["attn_impl"],
        "ln_placement": cfg["ln_placement"], "optimizer": cfg["optimizer"], "device": env["device"],
        "recompute_in_backward": "whole blocks" if cfg["activation_checkpointing"]
        else "attention core" if cfg["attn_recompute"] else "nothing",
    }


def run_facts(cfg, env, model, optimizer, data_dir, counts, dtype, sharded):
    """What was measured at the start of a fresh run, for comparing runs (runrecord.py): the data,
    the evaluation windows, the data order of the first steps and every initial weight (a real
    tensor-parallel model gathers its shards: every rank calls this)."""
    weights = sharding.full_model_state(model) if sharded else model.state_dict()
    if env["tp_group"] is not None:
        weights = model.full_state_dict(weights)
    accum = cfg["gradient_accumulation_steps"]
    order = [train_offsets(cfg, counts["train"], it, micro)
             for it in range(runrecord.DATA_ORDER_ITERS) for micro in range(accum)]
    meta = tokendata.read_meta(data_dir)
    dataset = runrecord.dataset_fingerprint(data_dir)
    return dict(dataset_fingerprint=dataset, tokenizer=meta.get("tokenizer"),
                eval_windows=runrecord.digest(dataset, *(runrecord.offsets_digest(eval_offsets(cfg, counts[s]))
                                                         for s in ("train", "val"))),
                data_order=runrecord.offsets_digest(order), init_weights=runrecord.weights_digests(weights),
                model_class=type(model).__name__, optimizer=type(optimizer).__name__, dtype=dtype,
                device_type=env["device"].split(":")[0], torch_version=torch.__version__,
                world_size=env["world_size"], tokens_per_iter=cfg["tokens_per_iter"])


def load_hellaswag(cfg, env):
    """The examples, loaded at start-up so a missing file fails before training; the master
    downloads first so ranks do not all fetch the file at once."""
    if not cfg["hellaswag_interval"]:
        return None
    source = cfg["hellaswag_input"] or "val"
    if env["master"]:
        examples = evaluation.load_examples(source, limit=cfg["hellaswag_limit"] or None)
    if env["ddp"]:
        dist.barrier()
    if not env["master"]:
        examples = evaluation.load_examples(source, limit=cfg["hellaswag_limit"] or None)
    return examples


def budget_reached(cfg, iter_num, tokens_seen, train_time):
    if iter_num >= cfg["max_iters"]:
        return "max_iters"
    if cfg["max_tokens"] and tokens_seen >= cfg["max_tokens"]:
        return "max_tokens"
    if cfg["max_time"] and train_time >= cfg["max_time"]:
        return "max_time"
    return None


class StopSignals:
    """SIGTERM (what Slurm and Kubernetes send before killing a job) and SIGINT (Ctrl-C): the first
    asks the loop to stop after the current step and write a checkpoint; a second raises
    Interrupted at once, wherever the process is (inside a save, the previous checkpoint stays)."""

    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.received = None  # the first signal's name
        self.previous = {}

    def __enter__(self):
        for signum in (signal.SIGTERM, signal.SIGINT):
            self.previous[signum] = signal.signal(signum, self.handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.received:
            raise Interrupted(f"second signal ({name} after {self.received}): stopped at once; "
                              f"{self.out_dir}/ckpt.pt holds the last checkpoint written", signum)
        self.received = name
        # os.write, not print: a handler that prints while the interrupted code prints raises "reentrant call"
        os.write(2, f"{name} received: finishing this step, then writing a checkpoint and stopping "
                    f"(send it again to stop at once)\n".encode())


def memory_estimate(cfg, env, dtype):
    """Bytes per rank for this run's layout (sharding.memory_estimate), from the model built on the
    meta device (no memory); a real tensor-parallel rank holds 1/tp_size of the weights."""
    model_cls, _ = model_classes(cfg)
    with torch.device("meta"):
        params = sum(p.numel() for p in model_cls(model_config(cfg)).parameters())
    params //= cfg["tp_size"] if env["tp_group"] is not None else 1
    return sharding.memory_estimate(cfg, params, env["world_size"], dtype)


def check_memory(cfg, env, dtype):
    """Refuse a run whose memory lower bound exceeds the device's memory (a CPU's RAM shared by its
    ranks), before anything is allocated."""
    if cfg["init_from"] not in ("scratch", "resume"):
        return
    device = env["device"]
    if device.startswith("cuda"):
        available, where = torch.cuda.get_device_properties(device).total_memory, device
    else:
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // ranks_here
        where = "this machine's RAM" + (f" per rank ({ranks_here} ranks)" if ranks_here > 1 else "")
    # A lower bound: the head's logits are left out (a chunked loss head never holds them whole).
    need = {k: v for k, v in memory_estimate(cfg, env, dtype).items() if k not in ("head", "total")}
    if sum(need.values()) > available:
        gib = lambda b: f"{b / 2**30:,.1f} GiB"
        parts = ", ".join(f"{k.replace('_', ' ')} {gib(v)}" for k, v in need.items())
        raise configurator.ConfigError(
            f"this run needs at least {gib(sum(need.values()))} per rank ({parts}) but {where} is "
            f"{gib(available)}: shrink the model, lower batch_size or block_size, or turn on activation_checkpointing")


def main(argv):
    cfg = configurator.apply_config(DEFAULTS, argv)
    world_size = int(os.environ.get("WORLD_SIZE", 1))  # torchrun's; the process group comes later
    validate(cfg, world_size)  # before a process group, data or weights exist
    env = setup_distributed(cfg["device"], parallel_layout(cfg, world_size)[0], timeout=cfg["dist_timeout"])
    try:
        stop_reason = run(cfg, env, command=["train.py", *argv])
    except RuntimeError as e:
        if env["ddp"]:
            name_stalled_ranks(e, env["rank"], env["world_size"], cfg["dist_timeout"])
        raise
    code = EXIT_STOPPED_BY_SIGNAL if stop_reason == "signal" else 0
    if env["ddp"]:
        exit_distributed(code)
    if code:
        sys.exit(code)


def run(cfg, env, command=("train.py",)):
    """Train with a validated cfg (main calls validate) on the ranks of env (setup_distributed), with
    out_dir locked for this run alone; returns the stop reason."""
    with rundir.out_dir_lock(cfg["out_dir"]) if env["master"] else nullcontext(), StopSignals(cfg["out_dir"]) as signals:
        return fit(cfg, env, signals, command)


def diverged(log, cfg, iter_num, what, **fields):
    log.event("diverged", f"iter {iter_num}: {what}: stopping; the last good checkpoint is untouched in "
              f"{cfg['out_dir']}", iter=iter_num, **fields)
    log.close()
    raise TrainingDiverged(f"{what} at iteration {iter_num}")


def fit(cfg, env, signals, command):
    device = env["device"]
    dtype, autocast = precision(cfg["dtype"], device)
    check_memory(cfg, env, dtype)
    if device == "cpu":
        keep_freed_memory()  # no mmap/page-fault/munmap of every activation in every step
    data_dir, counts = check_data(cfg)
    checkpoint = load_checkpoint(cfg) if cfg["init_from"] == "resume" else None
    resumed = checkpoint is not None
    hellaswag_examples = load_hellaswag(cfg, env)

    torch.manual_seed(cfg["seed"])  # identical initial weights on every rank
    model = build_model(cfg, checkpoint, env["tp_group"]).to(device)
    if cfg["init_from"] not in ("scratch", "resume"):
        cfg.update({k: getattr(model.config, k) for k in model_config_fields(GPTConfig)})
    raw_model = model
    weights_bytes = optim.weights_bytes(raw_model)
    # reduced_sync: count one tiny step's all-reduces against the schedule (before DDP's or FSDP's
    # hooks exist; it forks the RNG and clears its gradients)
    model_report = raw_model.startup_report(device) if hasattr(raw_model, "startup_report") else {}
    # FSDP shards a single process's model too little to matter: it trains as usual, with sharded checkpoints
    sharded = env["ddp"] and cfg["data_parallel"] != "ddp"
    env["mesh"] = sharding.device_mesh(cfg, device, env["world_size"]) if sharded else None
    if sharded:  # before the optimizer, which must hold the sharded parameters
        sharding.shard_model(raw_model, env["mesh"], dtype, cfg["fsdp_reduce_dtype"], cfg["compile"])
    act_norms = ActivationNorms(raw_model, cfg["log_act_norm_layers"])
    optimizer = optim.build_optimizer(raw_model, cfg)
    pruner = optim.Pruner(raw_model, optimizer, cfg, last_iter(cfg)) if cfg["pruning"] != "none" else None
    scaler = torch.amp.GradScaler(device.split(":")[0], enabled=dtype == "float16")

    grad_accum_local = cfg["gradient_accumulation_steps"] // env["dp_size"]
    tokens_per_iter = cfg["tokens_per_iter"]
    iter_num, tokens_seen, train_time, best_val, metrics = 0, 0, 0.0, float("inf"), None
    torch.manual_seed(cfg["seed"] + env["dp_rank"])  # dropout masks differ across replicas
    if checkpoint is not None and "sharded_path" in checkpoint:  # written by any number of ranks
        sharding.load(checkpoint["sharded_path"], raw_model, optimizer, env["tp_rank"])
    elif checkpoint is not None:
        optimizer.load_state_dict(optimizer_state_of(checkpoint, env))
    if checkpoint is not None:
        if pruner is not None and checkpoint.get("pruning"):  # a dense checkpoint starts with no masks
            pruner.load_state_dict(checkpoint["pruning"])
        scaler.load_state_dict(checkpoint["scaler"])
        iter_num, tokens_seen = checkpoint["iter_num"], checkpoint["tokens_seen"]
        train_time, best_val = checkpoint["train_time"], checkpoint["best_val_loss"]
        if len(checkpoint["rng"]) == env["world_size"]:
            set_rng_state(checkpoint["rng"][env["rank"]], device)
    del checkpoint

    if cfg["compile"] and not sharded:  # shard_model compiled the blocks one by one
        model = torch.compile(model)
    if env["ddp"] and not sharded:
        model = DDP(model, device_ids=[env["local_rank"]] if device.startswith("cuda") else None,
                    process_group=env["dp_group"])

    log = RunLog(cfg, env["master"])
    facts = None if resumed else run_facts(cfg, env, raw_model, optimizer, data_dir, counts, dtype, sharded)
    if env["master"]:
        with rundir.write_errors_named(f"{cfg['out_dir']}/config.json and run_info.json", "nothing was trained"):
            with tokendata.atomic_write(os.path.join(cfg["out_dir"], "config.json"), "w") as f:
                json.dump(cfg, f, indent=2, allow_nan=False)
            start = runrecord.provenance(REPO_DIR, list(command), device, env["world_size"])
            runrecord.write_run_info(cfg["out_dir"], REPO_DIR, start, facts, resumed)
    checklist = startup_checklist(cfg, env, raw_model, counts, data_dir, dtype, tokens_per_iter, grad_accum_local)
    memory = memory_estimate(cfg, env, dtype)
    # MFU on a CPU is against the matmul peak measured here, for this dtype (a GPU's: its data sheet)
    measured_peak = matmul_peak_flops(device, dtype) if device == "cpu" else None
    checklist.update(data_parallel_replicas=env["dp_size"],
                     data_parallel=cfg["data_parallel"] if env["ddp"] else "none (one process)",
                     memory_per_gpu_estimate=sharding.describe_memory(memory),
                     **{f"memory_estimate_{k}": v for k, v in memory.items()}, **model_report,
                     act_rms_after_layers=", ".join(map(str, act_norms.layers)),
                     mfu_against=f"measured {dtype} matmul peak {measured_peak / 1e9:.0f} GFLOP/s" if measured_peak
                     else "data-sheet bf16 peak")
    log.event("checklist", "\n".join(f"{k:>26}: {v}" for k, v in checklist.items()), **checklist)
    log.say(f"tokens per iteration = batch_size {cfg['batch_size']} x block_size {cfg['block_size']} x "
            f"gradient_accumulation_steps {cfg['gradient_accumulation_steps']} "
            f"({grad_accum_local} per rank x {env['dp_size']} data-parallel ranks) = {tokens_per_iter:,}")
    if pruner is not None:
        log.event("pruning", pruner.describe(), pruned=list(pruner.params), excluded=pruner.excluded)

    start_iter = iter_num
    window = dict(time=0.0, iters=0)  # training steps since the last log line
    stop_reason = budget_reached(cfg, iter_num, tokens_seen, train_time)
    while True:
        checkpoint_due = iter_num % cfg["eval_interval"] == 0 or stop_reason
        if checkpoint_due and stop_reason != "signal":  # a preempted job has seconds: save now, evaluate later
            losses = evaluate(model, cfg, env, data_dir, counts, autocast)
            if not all(math.isfinite(v) for v in losses.values()):  # never let a NaN model replace a good checkpoint
                diverged(log, cfg, iter_num, f"evaluation loss became train {losses['train']}, val {losses['val']}",
                         train_loss=losses["train"], val_loss=losses["val"])
            best_val = min(best_val, losses["val"])
            metrics = dict(iter=iter_num, tokens=tokens_seen, train_loss=losses["train"],
                           val_loss=losses["val"], val_ppl=math.exp(losses["val"]), best_val_loss=best_val,
                           **raw_model.metrics(), **optim.optimizer_metrics(optimizer),
                           **(pruner.metrics() if pruner is not None else {}),
                           # the notes' "training memory / model weights"; None where no honest peak exists
                           memory_ratio=peak_memory_mib(device) * 2**20 / weights_bytes
                           if device.startswith("cuda") else None)
            log.event("eval", f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, "
                      f"val ppl {metrics['val_ppl']:.2f}", **metrics)
            if hellaswag_examples and (iter_num % cfg["hellaswag_interval"] == 0 or stop_reason):
                # The uncompiled model: every batch has a different length and would recompile.
                result = evaluation.evaluate_hellaswag(raw_model, hellaswag_examples, device, autocast=autocast,
                                                      replica=(env["dp_rank"], env["dp_size"], env["dp_group"]))
                log.event("hellaswag", f"step {iter_num}: hellaswag acc {result['acc']:.4f}, acc_norm "
                          f"{result['acc_norm']:.4f} ({result['n']} examples)", iter=iter_num, tokens=tokens_seen,
                          **result)
        if checkpoint_due:
            rng = gathered_rng_states(env)
            meta = dict(scaler=scaler.state_dict(), config=cfg, iter_num=iter_num, tokens_seen=tokens_seen,
                        train_time=train_time, best_val_loss=best_val, rng=rng, metrics=metrics,
                        pruning=pruner.state_dict() if pruner is not None else None)
            if cfg["save_checkpoint"] and iter_num > start_iter and cfg["data_parallel"] != "ddp":
                sharding.save(cfg["out_dir"], iter_num, raw_model, optimizer, meta, env["master"], env["tp_rank"])
            elif cfg["save_checkpoint"] and iter_num > start_iter:
                model_state, optimizer_state = model_and_optimizer_states(raw_model, optimizer, env)
                if env["master"]:
                    rundir.save_checkpoint(os.path.join(cfg["out_dir"], "ckpt.pt"),
                                           dict(model=model_state, optimizer=optimizer_state, **meta))
        if stop_reason:
            break

        t0 = time.perf_counter()
        lr = learning_rate_at(cfg, iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=device)
        for micro in range(grad_accum_local):
            offsets = train_offsets(cfg, counts["train"], iter_num, micro * env["dp_size"] + env["dp_rank"])
            x, y = get_batch(data_dir, "train", offsets, cfg["block_size"], device)
            last = micro == grad_accum_local - 1
            # DDP would all-reduce after every backward, FSDP reduce-scatter: only the last micro-step
            # needs it (FSDP accumulates the unsharded gradients in fp32 until then).
            if sharded:
                raw_model.set_requires_gradient_sync(last)
            sync = model.no_sync() if env["ddp"] and not sharded and not last else nullcontext()
            with sync:
                with autocast:
                    _, loss = model(x, y)
                loss_sum += loss.detach().float()
                scaler.scale(loss / grad_accum_local).backward()
        if pruner is not None:
            pruner.mask_grads()  # before clipping: pruned weights add nothing to the norm
        scaler.unscale_(optimizer)
        grad_norm = clip_grad_norm(raw_model, cfg["grad_clip"] or float("inf"), env)
        scaler.step(optimizer, **optim.step_kwargs(optimizer, grad_norm))
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if pruner is not None:
            pruner.step(iter_num + 1)  # re-apply the masks; recompute them on the schedule

        # One small all-reduce gives every rank the same loss and the same clock, so all ranks
        # agree on when to stop (a disagreement would hang the next collective).
        # A stop signal on any rank stops all of them after this same step.
        shared = torch.stack([loss_sum / grad_accum_local, torch.tensor(time.perf_counter() - t0, device=device),
                              torch.tensor(float(signals.received is not None), device=device)])
        if env["ddp"]:
            dist.all_reduce(shared)
            shared /= env["world_size"]
        train_loss, dt, signalled = shared.tolist()
        grad_norm = grad_norm.item()
        iter_num += 1
        tokens_seen += tokens_per_iter
        train_time += dt
        window["time"] += dt
        window["iters"] += 1

        if not math.isfinite(train_loss) or (not math.isfinite(grad_norm) and not scaler.is_enabled()):
            diverged(log, cfg, iter_num, f"loss became {train_loss} (grad norm {grad_norm})", loss=train_loss,
                     grad_norm=grad_norm)

        if iter_num % cfg["log_interval"] == 0:
            step_time = window["time"] / window["iters"]
            tokens_per_sec = tokens_per_iter / step_time
            mfu = raw_model.estimate_mfu(tokens_per_sec / env["world_size"], device, peak=measured_peak)
            record = dict(iter=iter_num, tokens=tokens_seen, loss=train_loss, lr=lr, grad_norm=grad_norm,
                          **act_norms.read(), step_time_ms=1000 * step_time, tokens_per_sec=tokens_per_sec,
                          mfu=mfu, peak_memory_mib=peak_memory_mib(device), tokens_per_iter=tokens_per_iter)
            mfu_text = "n/a" if mfu is None else f"{100 * mfu:.1f}%"
            log.event("train", f"iter {iter_num}: loss {train_loss:.4f}, lr {lr:.3e}, grad norm {grad_norm:.3f}, "
                      f"{1000 * step_time:.1f} ms/iter, {tokens_per_sec:,.0f} tok/s, mfu {mfu_text}, "
                      f"peak mem {record['peak_memory_mib']:.0f} MiB", **record)
            window = dict(time=0.0, iters=0)
        stop_reason = budget_reached(cfg, iter_num, tokens_seen, train_time) or ("signal" if signalled else None)

    by = stop_reason
    if stop_reason == "signal":
        saved = cfg["save_checkpoint"] and iter_num > start_iter
        by = f"{signals.received or 'a signal to another rank'}" + (" (checkpoint written; resume with "
                                                                       "--init_from=resume)" if saved else "")
    log.event("end", f"stopped by {by} at iter {iter_num}, {tokens_seen:,} tokens, "
              f"{train_time:.1f} s of training; best val loss {best_val:.4f}", stop_reason=stop_reason,
              signal=signals.received, iter=iter_num, tokens=tokens_seen, train_time=train_time, best_val_loss=best_val)
    if cfg["sample_tokens"] and env["master"]:
        log.say("sample:\n" + evaluation.generate_text(raw_model, "\n", cfg["sample_tokens"], device=device, autocast=autocast))
    log.close()
    return stop_reason


if __name__ == "__main__":
    configurator.run_script(main, FileNotFoundError, TrainingDiverged, Interrupted, rundir.RunDirError, RankStalled)
