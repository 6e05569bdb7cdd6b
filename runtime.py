"""What the scripts share, one floor below them: the run configuration (DEFAULTS and its checks),
devices and process groups, precision, the model registry, building a model from a config or a
checkpoint, and reading batches.

train.py, sample.py, eval.py, hellaswag.py, sweep.py and the benchmarks import this module; it
imports only the models, the optimizer's checks and the data helpers, never an entry point.
"""
import ctypes
import datetime
import os
import sys
import threading
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist

import configurator
import optim
import rundir
import sharding
import tokendata
from kernels.linear_cross_entropy import check_head_loss
from model import GPT, GPTConfig, model_config_fields, unwrap_state_dict
from ra_model import RAConfig, RAGPT
from reduced_sync_model import ReducedSyncConfig, ReducedSyncGPT

REPO_DIR = os.path.dirname(os.path.abspath(__file__))

# The keys of a training run (train.py), each with its default and meaning. Config files and
# --key=value overrides set them (configurator.py); sweep.py expands them over grids.
DEFAULTS = dict(
    # run directory, evaluation and checkpoints
    out_dir="out",  # the run directory: config.json, log.jsonl, log.txt, ckpt.pt
    init_from="scratch",  # 'scratch', 'resume' (from out_dir/ckpt.pt), or a local HF GPT-2 directory
    eval_interval=500,  # also where checkpoints are written
    eval_iters=20,  # fixed batches per split per evaluation: the same windows in every run
    log_interval=10,  # a train log line every this many iterations
    save_checkpoint=True,  # write out_dir/ckpt.pt at evaluations
    sample_tokens=0,  # >0: print a sample of this many tokens at the end of the run
    hellaswag_interval=0,  # >0: HellaSwag accuracy at evaluations on multiples of this and at the end
    hellaswag_limit=0,  # the first N validation examples only (0: all 10,042)
    hellaswag_input="",  # a local hellaswag_val.jsonl; '' downloads it once into data/hellaswag/
    # data
    dataset="shakespeare",  # reads data/<dataset>/train.bin and val.bin
    data_dir="",  # default: data/<dataset> next to this file
    batch_size=12,  # micro-batch per process, in sequences
    block_size=1024,  # context length in tokens
    gradient_accumulation_steps=40,  # micro-steps per optimizer step, summed over all processes
    tokens_per_iter=0,  # >0: the tokens per optimizer step; gradient_accumulation_steps=0 derives from it
    # model
    model_type="gpt",  # 'gpt', 'ra', 'reduced_sync' (MODEL_TYPES)
    n_layer=12,  # transformer blocks
    n_head=12,  # attention heads per block
    n_embd=768,  # width of the residual stream
    vocab_size=50304,  # GPT-2's 50257 padded to a multiple of 64
    dropout=0.0,  # on embeddings, attention weights and residual branches (0: off)
    bias=True,  # biases in Linear layers and LayerNorms
    ln_placement="pre",  # 'pre' (GPT-2) or 'post' (original Transformer)
    attn_impl="sdpa",  # 'sdpa', 'manual' (materializes the scores), 'triton' (model_type='ra')
    activation_checkpointing=False,  # recompute each whole block in backward
    attn_recompute=False,  # recompute only the attention core in backward (model.attention_core)
    tie_weights=True,  # the head shares the token embedding matrix, as in GPT-2
    head_loss="chunked",  # training loss of the head: 'chunked' (no logits), 'full', 'liger', 'cce' (CUDA packages)
    # reciprocal attention and MLA (model_type='ra'; see ra_model.py for the meaning of each)
    ra_pattern="none",  # 'none', 'early', 'late', 'all', 'alternate', 'learned', 'layers'
    ra_layers=[],  # ra_pattern='layers': the reciprocal layers' indices
    ra_mode="mix",  # 'swap', 'mix', 'gate'
    ra_alpha=0.5,  # mix: weight of S^T (initial value when learned)
    ra_alpha_learn="none",  # 'none', 'layer', 'head'
    ra_gate_init=0.0,  # gate: initial logit of p
    ra_window=0,  # >0: the reciprocal term only within this many positions
    mla=False,  # multi-head latent attention in every layer
    mla_latent_dim=128,  # size of the shared K/V latent
    mla_per_head_q_latent=True,  # each head scores its query in the latent (else a key up-projection)
    mla_per_head_v_up=True,  # one value up-projection per head (else one shared)
    attn_gate=False,  # gated attention: sigmoid(W x) scales each head's output (arXiv 2505.06708)
    # reduced-synchronization tensor parallelism (model_type='reduced_sync'; see reduced_sync_model.py)
    block_pattern="tp",  # repeating unit of block types 'tp', 'spd', 'parallel', e.g. 'tp,spd' or 'spd,parallel,parallel'
    block_types=[],  # one block type per layer; overrides block_pattern
    tp_size=1,  # ranks per model replica under torchrun (world = tp_size x data-parallel replicas); one process simulates them
    sync_every=0,  # >0: parallel runs also sync every this many layers (grouped)
    sync_layers=[],  # parallel runs also sync after these layers (selective)
    # data parallelism across ranks (sharding.py)
    data_parallel="ddp",  # 'ddp' (replicate), 'fsdp' (shard all, FSDP2), 'hsdp' (shard in a node, replicate across)
    hsdp_shard_size=0,  # hsdp: data-parallel ranks per shard group; 0 means one node's (LOCAL_WORLD_SIZE / tp_size)
    fsdp_reduce_dtype="float32",  # fsdp/hsdp: gradient reductions in 'float32' or 'bfloat16' (weights follow dtype)
    # optimizer
    optimizer="adamw",  # 'adamw', 'adam', 'sgd', 'adamw_spam' (optim.py)
    optimizer_impl="fused",  # torch optimizers: 'fused' (CUDA and CPU), 'foreach', 'for_loop', '' (torch's choice); adamw_spam has its own
    learning_rate=6e-4,  # peak learning rate
    weight_decay=0.1,  # never on biases or norms
    beta1=0.9,  # adam, adamw, adamw_spam
    beta2=0.95,  # adam, adamw, adamw_spam
    momentum=0.9,  # sgd only
    nesterov=False,  # sgd only
    grad_clip=1.0,  # 0 disables clipping; the gradient norm is logged either way
    # optimizer extras and pruning (optim.py; formulas in ../shared/RESEARCH.md)
    spam_theta=50.0,  # adamw_spam: clip gradient entries with g^2 > theta * v_hat
    spam_spike_z=2.0,  # adamw_spam: a spike when the gradient norm's z-score exceeds this (m *= 0.5, v *= 0.9)
    spam_window=100,  # adamw_spam: the z-score is against the last this many gradient norms
    spam_interval=1000,  # adamw_spam: reset m and v every this many steps (0: never)
    spam_warmup=1000,  # adamw_spam: after a reset the lr re-warms with a cosine over this many steps
    pruning="none",  # 'none', 'magnitude', 'state' (scored by prune_score from Adam's states)
    prune_score="bitter7",  # pruning='state': 'bitter0' ... 'bitter7'
    target_sparsity=0.5,  # fraction of the pruned Linear weights that are zero at prune_ramp_end
    prune_start=100,  # the sparsity ramp starts after this many steps
    prune_ramp_end=0,  # ... and reaches target_sparsity here; 0 means the run's last iteration
    prune_interval=50,  # masks are recomputed every this many steps
    prune_ramp="cubic",  # 'cubic': s(t) = target * p^3, 'linear': target * p
    prune_threshold="exact",  # 'exact' global k-th value, or 'sampled' (a quantile of prune_sample scores)
    prune_sample=1_000_000,  # prune_threshold='sampled': scores drawn for the quantile
    # learning-rate schedule
    lr_schedule="cosine",  # 'cosine', 'constant', 'wsd' (warmup-stable-decay)
    warmup_iters=2000,  # linear warmup from 0 to learning_rate
    lr_decay_iters=0,  # where cosine reaches min_lr; 0 means max_iters
    min_lr=6e-5,  # the learning rate at the end of the decay
    wsd_decay_frac=0.2,  # wsd: the last fraction of lr_decay_iters decays linearly to min_lr
    # budgets: the run ends at whichever comes first (0 disables max_time / max_tokens)
    max_iters=600000,  # optimizer steps
    max_time=0.0,  # seconds spent in training steps (evaluation and checkpointing excluded)
    max_tokens=0,  # training tokens (a whole number of tokens_per_iter)
    # system
    device="",  # '' picks cuda when available, else cpu
    dist_timeout=600.0,  # seconds a rank waits in a collective for the others before the job ends (a frozen rank)
    dtype="",  # 'bfloat16', 'float16', 'float32'; '' picks bfloat16 where supported
    compile=False,  # torch.compile the model (a cold compile takes 20-35 s)
    seed=1337,  # initial weights, training batches and dropout
    # logging
    log_act_norm_layers=[0, -1],  # blocks whose output RMS is logged (negative counts from the end)
    wandb_log=False,  # also log to Weights & Biases
    wandb_project="gpt2-ablations",  # the W&B project
    wandb_run_name="",  # default: the name of out_dir
    wandb_group="",  # runs of one ablation suite share a group (sweep.py sets it)
    wandb_mode="",  # 'online', 'offline', 'disabled'; '' is online with an API key, else offline
)

# model_type -> (model class, its config dataclass). Every field of a config dataclass is a key of
# DEFAULTS, so each model's options are set like any other key.
MODEL_TYPES = {"gpt": (GPT, GPTConfig), "ra": (RAGPT, RAConfig), "reduced_sync": (ReducedSyncGPT, ReducedSyncConfig)}
# The keys that switch a model type's ideas on (check_model_keys_apply).
MODEL_SWITCHES = {"ra": ("ra_pattern", "mla", "attn_gate"),
                  "reduced_sync": ("block_pattern", "block_types", "sync_every", "sync_layers")}
LR_SCHEDULES = ("cosine", "constant", "wsd")


# ----------------------------------------------------------------------------- devices and precision

def setup_distributed(device="", tp_size=1, timeout=600.0):
    """World size, rank and device; under torchrun one process per device (or CPU rank). device ''
    picks cuda when available, else cpu. A collective that waits longer than `timeout` seconds for
    another rank (frozen, or stuck in a different collective) raises instead of hanging for good.

    With tp_size > 1 the ranks form a (dp, tp) device mesh: tp_size consecutive ranks hold one model
    replica (tp_group) and data parallelism runs across replicas (dp_group), e.g. 8 = DP 4 x TP 2.
    Data, evaluation batches and dropout seeds follow dp_rank, so a replica's ranks see the same batch.
    """
    ddp = int(os.environ.get("RANK", -1)) != -1
    device = pick_device(device)
    if not ddp:
        return dict(ddp=False, rank=0, local_rank=0, world_size=1, device=device, master=True,
                    dp_rank=0, dp_size=1, tp_rank=0, tp_group=None, dp_group=None)
    local_rank = int(os.environ["LOCAL_RANK"])
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo",
                            timeout=datetime.timedelta(seconds=timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    start_heartbeat(rank)
    env = dict(ddp=True, rank=rank, local_rank=local_rank, world_size=world, device=device, master=rank == 0,
               dp_rank=rank, dp_size=world, tp_rank=0, tp_group=None, dp_group=None)
    if tp_size > 1:  # parallel_layout checked it against the world size
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device.split(":")[0], (world // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
        env.update(dp_rank=mesh.get_local_rank("dp"), dp_size=world // tp_size, tp_rank=mesh.get_local_rank("tp"),
                   tp_group=mesh.get_group("tp"),
                   dp_group=mesh.get_group("dp"))
    return env


HEARTBEAT_SECONDS = 1.0


class RankStalled(RuntimeError):
    pass


def job_store():
    """A client of the job's key-value store (under torchrun, the launcher's own: it outlives any rank)."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=5))


def start_heartbeat(rank):
    """A thread that stamps this rank's clock into the job store every second. A rank waiting in a
    collective keeps beating (the wait releases the GIL); a frozen process (SIGSTOP, a swapped-out
    or wedged node) does not, and that is how name_stalled_ranks tells who to blame."""
    def beat():
        try:
            store = job_store()
            while True:
                store.set(f"heartbeat/{rank}", repr(time.time()))
                time.sleep(HEARTBEAT_SECONDS)
        except Exception:  # the store went away: the job is ending
            return
    threading.Thread(target=beat, name="heartbeat", daemon=True).start()


def name_stalled_ranks(error, rank, world_size, timeout):
    """Raise RankStalled naming the ranks whose heartbeat stopped, when `error` (a failed or timed
    out collective) is explained by them; return quietly otherwise, for the caller to re-raise."""
    try:
        store, now = job_store(), time.time()
        silent = {r: now - float(store.get(f"heartbeat/{r}")) for r in range(world_size)}
    except Exception:
        return
    # A frozen rank has been silent about as long as the collective waited; a live one, a beat or two.
    stalled = {r: age for r, age in silent.items() if age > max(3 * HEARTBEAT_SECONDS, timeout / 2)}
    if not stalled and "timed out" in str(error).lower():
        raise RankStalled(f"rank {rank} waited dist_timeout={timeout:g} s in a collective that the other ranks, "
                          f"all alive, never joined: they disagree on which collective comes next (a bug), or one "
                          f"is busy longer than dist_timeout (raise it)") from None
    if stalled:
        names = ", ".join(f"rank {r} (silent for {age:.0f} s)" for r, age in sorted(stalled.items()))
        raise RankStalled(f"{names} stopped responding, frozen or stuck outside Python; rank {rank} waited "
                          f"dist_timeout={timeout:g} s in a collective and ended the job "
                          f"({str(error).splitlines()[0].rsplit('] ', 1)[-1][:120]})") from None


def pick_device(device):
    """The device to run on: '' picks cuda when available, else cpu; a GPU asked for but absent
    is refused here rather than at the first tensor moved onto it."""
    if not device:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise configurator.ConfigError(f"device={device!r} but no CUDA GPU is visible to this process: "
                                       f"use --device=cpu, or run where a GPU is (check CUDA_VISIBLE_DEVICES)")
    return device


def exit_distributed(code=0):
    """End a successful distributed run: wait for every rank, tear the process group down, and
    leave the process at once. The barrier keeps a rank that finishes first (rank 0 may still be
    writing a checkpoint) from closing its gloo connections under the others' feet. os._exit
    skips the interpreter's finalization, which can abort a finished run otherwise: a gloo worker
    thread may still be releasing the tensors of the last collectives (a barrier holds the work in
    flight before it), releasing a tensor takes the GIL, and a thread asking for the GIL while
    Python finalizes is stopped inside a C++ destructor: std::terminate, SIGABRT, about one run in
    twenty on a busy 2-core machine. Everything is written and closed by then. Call it on success
    only: after an error the other ranks may never reach the barrier."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


DTYPES = ("bfloat16", "float16", "float32")


def precision(dtype, device):
    """The autocast dtype to use ('' picks the best supported one) and its autocast context.
    Used by every script that runs a model, so training and evaluation compute alike."""
    if dtype and dtype not in DTYPES:
        raise configurator.ConfigError(f"dtype={dtype!r}: use one of {DTYPES} or '' (automatic)")
    if dtype == "float16" and not device.startswith("cuda"):
        raise configurator.ConfigError("dtype='float16' needs a GPU; use bfloat16 or float32 on CPU")
    if not dtype and device.startswith("cuda"):
        dtype = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    elif not dtype:
        # bf16 matmuls run ~2.8x faster than fp32 on CPUs with AVX512-BF16/AMX, and are emulated
        # (slowly) elsewhere.
        dtype = "bfloat16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "float32"
    if dtype == "float32":
        return dtype, nullcontext()
    return dtype, torch.autocast(device_type=device.split(":")[0], dtype=getattr(torch, dtype))


def matmul_peak_flops(device, dtype, repeats=5):
    """The machine's measured matmul peak in FLOP/s for `dtype`: the fastest of a few square
    products (n = 2048 on CPU, 8192 on GPUs; well under a second on 2 CPU cores). A CPU has no
    data-sheet peak worth quoting: bf16 is native on some (AVX512-BF16, AMX) and emulated hundreds
    of times slower on others, and other processes take their share. Model FLOP/s over this is
    'MFU against the measured peak'; measure it next to the steps it is compared with."""
    n = 8192 if device.startswith("cuda") else 2048
    generator = torch.Generator(device).manual_seed(0)  # not the global stream: resume must replay it exactly
    a, b = (torch.randn(n, n, device=device, generator=generator).to(getattr(torch, dtype)) for _ in range(2))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    best = float("inf")
    for _ in range(repeats + 1):  # the first warms up the kernels and the caches
        sync()
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def keep_freed_memory():
    """Make glibc's malloc keep freed memory for reuse (Linux CPUs; a no-op elsewhere).

    By default each allocation over 128 KiB-32 MiB is a fresh mmap, and a training step's
    activations and gradients are far larger: every step maps them, page-faults every page in
    (the kernel zeroes it) and unmaps them again. That churn was the 216 s of system time against
    366 s of user time of a CPU twin run. With mmap off and trimming off, the heap grows to the
    step's peak once and later steps reuse it (measured at the CPU twin shape: minor page faults
    per step 590k -> 25k, system time 1.1 s -> 0.1 s). The process keeps its peak resident."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl): leave its allocator alone
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # <malloc.h>
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def data_dir_of(cfg):
    return cfg["data_dir"] or os.path.join(REPO_DIR, "data", cfg["dataset"])



# ----------------------------------------------------------------------------- the run configuration

def validate(cfg, world_size):
    """Every check that can fail before a process group, data or weights exist, for a launch of
    world_size processes (sweep.py checks its runs with 1); errors name keys and fixes."""
    err = configurator.ConfigError
    model_config(cfg)  # shape checks (n_embd divisible by n_head, ...)
    check_head_loss(cfg["head_loss"], pick_device(cfg["device"]).split(":")[0])  # a CUDA kernel elsewhere
    _, dp_size = parallel_layout(cfg, world_size)
    check_model_keys_apply(cfg)
    sharding.check(cfg, world_size)
    positive = ("batch_size", "block_size", "max_iters", "eval_interval", "eval_iters", "log_interval", "dist_timeout")
    for key in positive:
        if cfg[key] < 1:
            raise err(f"{key} must be >= 1, got {cfg[key]}")
    for key in ("gradient_accumulation_steps", "tokens_per_iter", "max_time", "max_tokens", "warmup_iters", "lr_decay_iters", "sample_tokens",
                "hellaswag_interval", "hellaswag_limit", "learning_rate", "min_lr", "weight_decay", "grad_clip"):
        if cfg[key] < 0:
            raise err(f"{key} must be >= 0, got {cfg[key]}")
    resolve_batch(cfg, dp_size)
    optim.validate(cfg, last_iter(cfg))
    if cfg["lr_schedule"] not in LR_SCHEDULES:
        raise err(f"lr_schedule={cfg['lr_schedule']!r}: use one of {LR_SCHEDULES}")
    if cfg["lr_schedule"] != "constant" and cfg["warmup_iters"] > decay_iters(cfg):
        raise err(f"warmup_iters={cfg['warmup_iters']} exceeds lr_decay_iters={decay_iters(cfg)} (by default the "
                  f"iterations in max_iters or max_tokens): shorten warmup or lengthen the decay")
    if cfg["min_lr"] > cfg["learning_rate"]:
        raise err(f"min_lr={cfg['min_lr']} exceeds learning_rate={cfg['learning_rate']}")
    if not 0.0 < cfg["wsd_decay_frac"] <= 1.0:
        raise err(f"wsd_decay_frac must be in (0, 1], got {cfg['wsd_decay_frac']}")
    for layer in cfg["log_act_norm_layers"]:
        if not -cfg["n_layer"] <= layer < cfg["n_layer"]:
            raise err(f"log_act_norm_layers contains {layer}, but the model has {cfg['n_layer']} layers")
    if cfg["init_from"] not in ("scratch", "resume") and cfg["model_type"] != "gpt":
        raise err(f"init_from a Hugging Face GPT-2 needs model_type='gpt', not {cfg['model_type']!r}")
    if cfg["init_from"] not in ("scratch", "resume") and not os.path.isdir(cfg["init_from"]):
        raise err(f"init_from={cfg['init_from']!r} is neither 'scratch', 'resume' nor a directory "
                  f"holding a Hugging Face GPT-2 checkpoint")
    if cfg["hellaswag_interval"] and cfg["vocab_size"] < tokendata.GPT2_VOCAB_SIZE:
        raise err(f"HellaSwag is tokenized with GPT-2's BPE, which needs vocab_size >= {tokendata.GPT2_VOCAB_SIZE}, "
                  f"not {cfg['vocab_size']}: set hellaswag_interval=0")
    if cfg["init_from"] == "resume" and cfg["data_parallel"] == "ddp" and not os.path.exists(
            os.path.join(cfg["out_dir"], "ckpt.pt")):
        sharded = " (dcp/ holds a sharded one: resume with data_parallel='fsdp' or 'hsdp', or write a ckpt.pt " \
                  "with export_checkpoint.py)" if sharding.latest_checkpoint(cfg["out_dir"]) else ""
        raise err(f"init_from='resume' but {cfg['out_dir']}/ckpt.pt does not exist{sharded}")
    if (cfg["init_from"] == "resume" and cfg["data_parallel"] != "ddp"
            and not sharding.latest_checkpoint(cfg["out_dir"])):
        raise err(f"init_from='resume' with data_parallel={cfg['data_parallel']!r} but {cfg['out_dir']}/dcp/latest "
                  f"does not exist (an ordinary ckpt.pt resumes with data_parallel='ddp')")


def check_model_keys_apply(cfg):
    """A key that switches on another model type's idea would be silently ignored (attn_gate=True on
    model_type='gpt' would train the baseline): refuse it. Settings that only shape an idea that is
    off (a shared recipe's mla_latent_dim) may stay; tp_size is parallel_layout's."""
    for model_type, keys in MODEL_SWITCHES.items():
        for key in keys if model_type != cfg["model_type"] else ():
            if cfg[key] != DEFAULTS[key]:
                raise configurator.ConfigError(f"{key}={cfg[key]!r} applies to model_type={model_type!r} only, not "
                                               f"{cfg['model_type']!r}: set model_type={model_type!r} or leave {key} "
                                               f"at {DEFAULTS[key]!r}")


def parallel_layout(cfg, world_size):
    """(ranks per model replica, data-parallel replicas) for a launch of world_size processes: the
    one place where tp_size meets the model type and the launch. A single process simulates all
    tp_size shards (ReducedSyncConfig checks that they divide the heads)."""
    tp = cfg["tp_size"]
    if tp != 1 and cfg["model_type"] != "reduced_sync":
        raise configurator.ConfigError(f"tp_size={tp} needs model_type='reduced_sync'")
    if world_size == 1:
        return 1, 1
    if world_size % tp:
        raise configurator.ConfigError(f"tp_size={tp} does not divide the world size {world_size}: launch a "
                                       f"multiple of {tp} processes or change tp_size")
    return tp, world_size // tp


def resolve_batch(cfg, world_size):
    """Settle gradient_accumulation_steps and tokens_per_iter, stating one derives the other.

    The notes compare runs at equal tokens per step and equal token budgets, so a budget that the
    batch shape cannot meet exactly is refused rather than rounded.
    """
    err = configurator.ConfigError
    sequence_tokens = cfg["batch_size"] * cfg["block_size"]
    accum, target = cfg["gradient_accumulation_steps"], cfg["tokens_per_iter"]
    if not accum and not target:
        raise err("gradient_accumulation_steps=0 means 'derive it from tokens_per_iter', which is 0 too: set one")
    if target:
        if target % (sequence_tokens * world_size):
            raise err(f"tokens_per_iter={target} is not a multiple of batch_size {cfg['batch_size']} x block_size "
                      f"{cfg['block_size']} x world size {world_size} = {sequence_tokens * world_size}: change "
                      f"tokens_per_iter or batch_size")
        if accum and accum != target // sequence_tokens:
            raise err(f"gradient_accumulation_steps={accum} and tokens_per_iter={target} disagree (batch_size x "
                      f"block_size = {sequence_tokens}): set gradient_accumulation_steps=0 to derive it")
        accum = target // sequence_tokens
    if accum % world_size:
        raise err(f"gradient_accumulation_steps={accum} is the total over all processes and must be divisible "
                  f"by the world size {world_size}")
    cfg["gradient_accumulation_steps"], cfg["tokens_per_iter"] = accum, accum * sequence_tokens
    if cfg["max_tokens"] % cfg["tokens_per_iter"]:
        whole = cfg["max_tokens"] // cfg["tokens_per_iter"] * cfg["tokens_per_iter"]
        raise err(f"max_tokens={cfg['max_tokens']} is not a whole number of iterations of tokens_per_iter="
                  f"{cfg['tokens_per_iter']}: use {whole} or {whole + cfg['tokens_per_iter']}")


def last_iter(cfg):
    """The run's last iteration: max_iters, or earlier where max_tokens ends the run (tokens_per_iter
    settled by resolve_batch). Everything that ends with the run asks here: the learning-rate decay,
    the pruning ramp, the start-up checklist's token budget. (max_time ends a run unpredictably.)"""
    if cfg["max_tokens"]:
        return min(cfg["max_iters"], cfg["max_tokens"] // cfg["tokens_per_iter"])
    return cfg["max_iters"]


def decay_iters(cfg):
    """Where the schedule reaches min_lr: lr_decay_iters, else the run's last iteration."""
    return cfg["lr_decay_iters"] or last_iter(cfg)



# ----------------------------------------------------------------------------- models

def model_classes(cfg):
    model_type = cfg.get("model_type", "gpt")  # checkpoints written before model_type existed
    if model_type not in MODEL_TYPES:
        raise configurator.ConfigError(f"model_type={model_type!r}: use one of {tuple(MODEL_TYPES)}")
    return MODEL_TYPES[model_type]


def model_config(cfg):
    """The model's config dataclass filled from a run config (or a checkpoint's)."""
    _, config_cls = model_classes(cfg)
    # A checkpoint written before a field existed gets its default. The dataclass checks itself
    # and raises ConfigError, like every other key's check.
    return config_cls(**{k: cfg[k] for k in model_config_fields(config_cls) if k in cfg})


def build_model(cfg, checkpoint=None, tp_group=None):
    """A fresh model, a checkpoint's (built from the checkpoint's own config), or HF GPT-2 weights.
    With a tp_group, a reduced_sync model keeps only this rank's shards (checkpoints hold full weights)."""
    if checkpoint is not None:
        cfg = checkpoint["config"]
    if checkpoint is not None or cfg["init_from"] in ("scratch", "resume"):
        model_cls, _ = model_classes(cfg)
        model = model_cls(model_config(cfg), **({} if tp_group is None else dict(tp_group=tp_group)))
        # a sharded checkpoint's weights are read once the model is sharded (sharding.load)
        if checkpoint is not None and "model" in checkpoint:
            getattr(model, "load_full_state_dict", model.load_state_dict)(unwrap_state_dict(checkpoint["model"]))
        return model
    return GPT.from_pretrained(cfg["init_from"], dropout=cfg["dropout"], attn_impl=cfg["attn_impl"],
                               activation_checkpointing=cfg["activation_checkpointing"],
                               attn_recompute=cfg["attn_recompute"], head_loss=cfg["head_loss"])


# Model keys that change how the weights are trained, not what they are: a resumed run may change
# them (e.g. turn recomputation on after running out of memory) and the model is built with the new ones.
RESUMABLE_MODEL_KEYS = ("dropout", "activation_checkpointing", "attn_recompute", "head_loss")


def load_checkpoint(cfg):
    """out_dir/ckpt.pt, or under data_parallel 'fsdp'/'hsdp' the newest sharded checkpoint's meta.pt
    (its weights and optimizer state are read once the model is sharded: sharding.load)."""
    if cfg["data_parallel"] != "ddp":
        path = sharding.latest_checkpoint(cfg["out_dir"])
        ckpt = dict(sharding.read_meta(path), sharded_path=path)
    else:
        ckpt = rundir.load_checkpoint_file(os.path.join(cfg["out_dir"], "ckpt.pt"))
    saved = ckpt["config"]
    keys = ["model_type"] + model_config_fields(model_classes(saved)[1])
    conflicts = {k: (saved.get(k, DEFAULTS[k]), cfg[k]) for k in keys
                 if k not in RESUMABLE_MODEL_KEYS and saved.get(k, DEFAULTS[k]) != cfg[k]}
    if conflicts:
        details = ", ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in conflicts.items())
        raise configurator.ConfigError(f"resuming with a different model shape ({details}): "
                                       f"use the run's own config or a new out_dir")
    ckpt["config"] = {**saved, **{k: cfg[k] for k in RESUMABLE_MODEL_KEYS}}
    return ckpt


def load_model(cfg, device):
    """The model to evaluate or sample from: out_dir/ckpt.pt when init_from='resume' (built from the
    checkpoint's own config), else a local Hugging Face GPT-2 directory."""
    if cfg["init_from"] == "resume":
        path = os.path.join(cfg["out_dir"], "ckpt.pt")
        if not os.path.exists(path) and sharding.latest_checkpoint(cfg["out_dir"]):
            raise FileNotFoundError(f"{path} not found but {cfg['out_dir']}/dcp holds a sharded checkpoint: write "
                                    f"one file first with `python export_checkpoint.py --out_dir={cfg['out_dir']}`")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found: train first, or pass --init_from=<HF GPT-2 directory>")
        ckpt = rundir.load_checkpoint_file(path)
        model = build_model(ckpt["config"], ckpt)
    else:
        model = GPT.from_pretrained(cfg["init_from"])
    return model.to(device)


# ----------------------------------------------------------------------------- data

def get_batch(data_dir, split, offsets, block_size, device):
    data = tokendata.open_split(data_dir, split)  # fresh memmap per batch, see tokendata.open_split
    x = torch.from_numpy(np.stack([data[i:i + block_size].astype(np.int64) for i in offsets]))
    y = torch.from_numpy(np.stack([data[i + 1:i + 1 + block_size].astype(np.int64) for i in offsets]))
    if device.startswith("cuda"):
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x, y

