"""Beyond one GPU's memory, with PyTorch's own engine: FSDP2 sharding (data_parallel='fsdp' or
'hsdp'), sharded checkpoints through torch.distributed.checkpoint (DCP), and an estimate of the
memory a layout needs per GPU.

- fsdp: every rank holds 1/world of each parameter, gradient and optimizer state; a block's full
  weights exist only while it runs (all-gathered before, resharded after).
- hsdp: shard within a group of hsdp_shard_size ranks (one node by default), replicate across the
  groups: all-gathers stay on the node's fast links, only the gradient all-reduce crosses nodes.
- with a reduced_sync model and tp_size > 1 (a 3-D layout): each of the tp_size ranks of a model
  replica holds its own heads and MLP columns as plain tensors (reduced_sync_model.py), and FSDP/HSDP
  shards those across the data-parallel ranks that hold the same tensor-parallel position. The mesh is
  (shard, tp) or (replicate, shard, tp), with tp innermost: a replica's ranks are consecutive, as
  under DDP (parallel.ParallelLayout).

A sharded checkpoint is a directory out_dir/dcp/iter_NNNNNNN/ written by every rank at once (its
own shards) plus meta.pt (config, counters, RNG states); out_dir/dcp/latest names the newest
complete one and is replaced atomically only after every rank has finished writing, so a crash
mid-save leaves the previous checkpoint in charge. DCP reshards on load: a run may resume on a
different number of data-parallel ranks. Tensor-parallel positions hold different tensors under the
same names, so each position's state is stored under its own key (tp0, tp1, ...): tp_size is part of
the model's shape and stays fixed on resume. export_checkpoint.py turns one into an ordinary ckpt.pt.
"""
import dataclasses
import os
import re
import shutil

import sys

import torch
import torch.distributed as dist

import configurator
import rundir
from kernels.linear_cross_entropy import CHUNK_LOGITS
from ra_model import IDEAS
from reduced_sync_model import shard_tensor, unshard_tensor

DATA_PARALLEL = ("ddp", "fsdp", "hsdp")
REDUCE_DTYPES = ("float32", "bfloat16")


def check(cfg):
    """data_parallel and fsdp_reduce_dtype against the rest of the run (parallel.ParallelLayout.plan,
    which checks the degrees, calls it before any process group exists)."""
    err = configurator.ConfigError
    mode = cfg["data_parallel"]
    if mode not in DATA_PARALLEL:
        raise err(f"data_parallel={mode!r}: use one of {DATA_PARALLEL}")
    if cfg["fsdp_reduce_dtype"] not in REDUCE_DTYPES:
        raise err(f"fsdp_reduce_dtype={cfg['fsdp_reduce_dtype']!r}: use one of {REDUCE_DTYPES}")
    if mode == "ddp":
        return
    # Ideas whose state lives outside the sharded engine's reach are refused rather than half-sharded.
    refusals = {
        "compile": (cfg["compile"] and cfg["model_type"] == "reduced_sync",
                    "a reduced-sync model is sharded as one unit, which is not compiled: compile=False"),
        "optimizer_impl": (cfg["optimizer"] == "sgd" and cfg["optimizer_impl"] == "fused",
                           "torch has no fused SGD for sharded (DTensor) parameters: optimizer_impl='foreach'"),
        "pruning": (cfg["pruning"] != "none", "the pruning masks cover whole weights: use data_parallel='ddp'"),
        "optimizer": (cfg["optimizer"] == "adamw_spam", "AdamW-SPAM's per-parameter statistics are not "
                                                        "shard-aware: use adamw, adam or sgd"),
        "dtype": (cfg["dtype"] == "float16", "float16 needs loss scaling, which is not shard-aware here: use "
                                             "bfloat16 or float32"),
        "hellaswag_interval": (cfg["hellaswag_interval"] > 0, "export the checkpoint (export_checkpoint.py) and "
                                                              "run hellaswag.py on it"),
        "sample_tokens": (cfg["sample_tokens"] > 0, "export the checkpoint (export_checkpoint.py) and run "
                                                    "sample.py on it"),
    }
    for key, (refused, fix) in refusals.items():
        if refused:
            raise err(f"{key}={cfg[key]!r} does not combine with data_parallel={mode!r}: {fix}")


def shard_size(cfg, world_size):
    """Data-parallel ranks per shard group: all of them for fsdp; for hsdp hsdp_shard_size, or the
    model replicas of one node (torchrun's LOCAL_WORLD_SIZE / tp_size)."""
    tp = cfg["tp_size"]
    if cfg["data_parallel"] == "fsdp":
        return world_size // tp
    return cfg["hsdp_shard_size"] or int(os.environ.get("LOCAL_WORLD_SIZE", world_size)) // tp


# DCP, FSDP and DTensor are imported where they are used: together they add about a second to the start of
# every process that imports this module (train.py, sweep.py, report.py ...), and most runs never shard.

def local_piece(t):
    """This rank's piece of a tensor: an FSDP shard's (a DTensor's) local part, else the tensor itself. A
    DTensor exists only once torch.distributed.tensor is imported, so a run that never shards never imports it."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return t.to_local() if dtensor is not None and isinstance(t, dtensor.DTensor) else t


def local_weights_bytes(model):
    """Memory of the parameters this rank holds: an FSDP parameter's local shard, a tensor-parallel
    rank's own slices; shared (tied) tensors counted once."""
    local = [local_piece(p) for p in model.parameters()]
    return sum({t.data_ptr(): t.numel() * t.element_size() for t in local}.values())


def shard_model(model, mesh, dtype, reduce_dtype):
    """fully_shard each transformer block, then the root (embeddings, final norm, head); a model that
    reads its blocks' weights without calling them (reduced_sync) is one unit, gathered whole in
    forward and backward but with its weights, gradients and optimizer states sharded at rest. Parameters
    are all-gathered in the run's dtype (autocast's choice, so bf16 weights feed bf16 matmuls) and
    gradients reduced in reduce_dtype; the sharded master weights and optimizer states stay float32.
    Blocks compiled beforehand (parallel.compile_model) stay compiled one by one: FSDP's hooks sit
    between them, where a whole-model graph would break."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=None if dtype == "float32" else getattr(torch, dtype),
                                  reduce_dtype=getattr(torch, reduce_dtype))
    blocks = list(model.transformer.h) if model.blocks_run_as_modules else []
    for block in blocks:
        # The last block's weights are the first that backward needs: no reshard and re-gather
        # between them (the root's are kept gathered by FSDP itself). Between micro-steps of gradient
        # accumulation every unit reshards: the memory is the point of sharding.
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=block is not blocks[-1])
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def full_model_state(model):
    """Every weight as a full tensor on every rank (collective), as model.state_dict() gives unsharded."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


@torch.no_grad()
def clip_grad_norm(model, max_norm, shard_group=None):
    """torch.nn.utils.clip_grad_norm_ over the whole model when its gradients are split across ranks:
    FSDP's shards (DTensors: this rank's piece is to_local(); their squared norms summed over
    shard_group, the ranks that split one tensor) and a real tensor-parallel model's heads and MLP
    columns (summed over its tp_group; the parameters it replicates have identical gradients on every
    tp rank and are counted once). One or two scalar all-reduces; every rank clips alike."""
    tp_group = getattr(model, "tp_group", None)
    split_over_tp = getattr(model, "is_sharded", lambda name: False)
    pieces = ([], [])  # replicated over tp, split over tp
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        # torch.nn.utils.clip_grads_with_norm_ left DTensor gradients unscaled (torch 2.13, CPU, found
        # by the FSDP == DDP test): each rank scales its own piece in place instead.
        pieces[int(split_over_tp(name))].append(local_piece(p.grad))
    # foreach norms of each group (as torch's own clip), squared and summed across ranks in float64
    device = next(model.parameters()).device  # an empty group's norm is a CPU zero
    sums = torch.stack([torch.nn.utils.get_total_norm(group).to(device) for group in pieces]).double().pow(2)
    if shard_group is not None:
        dist.all_reduce(sums, group=shard_group)
    if tp_group is not None:
        dist.all_reduce(sums[1:], group=tp_group)
    norm = sums.sum().sqrt()
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for grad in pieces[0] + pieces[1]:
        grad.mul_(coef.to(grad.dtype))
    return norm.float()


# ----------------------------------------------------------------------------- distributed checkpoints

def read_meta(path):
    return rundir.load_checkpoint_file(os.path.join(path, "meta.pt"))


def save(out_dir, iter_num, model, optimizer, meta, master, tp_rank=0):
    """Every rank writes its shards into a fresh directory; then the master writes meta.pt and
    points `latest` at it (atomic rename), and removes the older ones. Collective."""
    name = f"iter_{iter_num:07d}"
    path = os.path.join(rundir.checkpoint_root(out_dir), name)
    if master and os.path.exists(path):  # a save of this iteration that crashed earlier
        shutil.rmtree(path)
    barrier()
    import torch.distributed.checkpoint as dcp
    dcp.save(keyed_state(model, optimizer, tp_rank), checkpoint_id=path, no_dist=not dist.is_initialized())
    barrier()  # every rank's shards are on disk
    if master:
        rundir.save_checkpoint(os.path.join(path, "meta.pt"), meta)
        with rundir.atomic_write(os.path.join(rundir.checkpoint_root(out_dir), "latest"), "w") as f:
            f.write(name)
        for old in os.listdir(rundir.checkpoint_root(out_dir)):
            if old.startswith("iter_") and old != name:
                shutil.rmtree(os.path.join(rundir.checkpoint_root(out_dir), old))
    barrier()


def barrier():
    if dist.is_initialized():  # a single process writes a sharded checkpoint too (one shard)
        dist.barrier()


def keyed_state(model, optimizer, tp_rank):
    """The state DCP stores, {model, optimizer} x {tp<rank>: fully-qualified names -> tensors}."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": {f"tp{tp_rank}": model_state}, "optimizer": {f"tp{tp_rank}": optimizer_state}}


def read_shards(state, path, no_dist):
    """dcp.load, with a damaged checkpoint (a half-written or truncated shard file, a missing one)
    named in one line on every rank instead of the storage reader's traceback."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    try:
        dcp.load(state, checkpoint_id=path, no_dist=no_dist)
    except (Exception, CheckpointException) as e:  # the latter derives from BaseException
        # CheckpointException carries each rank's traceback as text: its last error line is the cause
        causes = [l.strip() for l in str(e).splitlines() if re.match(r"\s*\w+(Error|Exception): ", l)]
        cause = (causes[-1] if causes else f"{type(e).__name__}: {e}").split(". ")[0][:160]
        raise rundir.RunDirError(f"the sharded checkpoint {path} cannot be read ({cause}): it is damaged; restore "
                                 f"it, or remove it and point {os.path.dirname(path)}/latest at an intact one") from None


def load(path, model, optimizer, tp_rank=0):
    """Fill the model and optimizer from a checkpoint written by any number of data-parallel ranks:
    sharded ones on every rank of a run."""
    from torch.distributed.checkpoint.state_dict import set_state_dict
    state = keyed_state(model, optimizer, tp_rank)
    read_shards(state, path, no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"][f"tp{tp_rank}"],
                   optim_state_dict=state["optimizer"][f"tp{tp_rank}"])


def load_whole(path, model, optimizer, tp_size):
    """Fill one process's whole (GPT-layout) model and its optimizer from a sharded checkpoint that
    tp_size tensor-parallel positions wrote: each position's heads and MLP columns are read into
    that position's slice (shard_tensor) and the slices joined (unshard_tensor); an optimizer's
    per-element states (momentum, Adam's moments) are split and joined like their parameter."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_state, optimizer_state = get_state_dict(model, optimizer)

    def per_element(name, value):
        return torch.is_tensor(value) and value.shape == model_state[name].shape

    def position(r):
        split = lambda name, value: shard_tensor(name, value, r, tp_size) if per_element(name, value) else value
        state = {name: {k: split(name, v) for k, v in states.items()} for name, states in optimizer_state["state"].items()}
        return {"model": {f"tp{r}": {name: split(name, v) for name, v in model_state.items()}},
                "optimizer": {f"tp{r}": dict(optimizer_state, state=state)}}

    positions = [position(r) for r in range(tp_size)]
    for state in positions:
        read_shards(state, path, no_dist=True)
    models = [state["model"][f"tp{r}"] for r, state in enumerate(positions)]
    states = [state["optimizer"][f"tp{r}"]["state"] for r, state in enumerate(positions)]
    whole_state = {name: {k: unshard_tensor(name, [s[name][k] for s in states]) if per_element(name, v) else states[0][name][k]
                          for k, v in per_param.items()} for name, per_param in optimizer_state["state"].items()}
    whole_model = {name: unshard_tensor(name, [m[name] for m in models]) for name in model_state}
    set_state_dict(model, optimizer, model_state_dict=whole_model,
                   optim_state_dict=dict(positions[0]["optimizer"]["tp0"], state=whole_state))


# ----------------------------------------------------------------------------- memory per GPU

def attention_weights(cfg, tokens, device_type):
    """(bytes kept per layer, bytes at the peak of one layer) of materialized T x T attention weights.
    attn_impl='manual' builds them on every device, and so does PyTorch's math kernel, which SDPA
    falls back to on a CPU when dropout is on. Per element: the float32 softmax (its precision under
    autocast), and with dropout also the dropped-out copy and the bool mask; gate runs two streams;
    attn_recompute keeps none between forward and backward. A layer's backward holds two more. An idea that
    builds the scores whatever attn_impl says declares the T x T tensors it keeps per softmax
    (ra_model.Idea.kept_scores: soft-capping keeps its tanh's output too), and its streams (score_streams)."""
    ideas = IDEAS.values() if cfg["model_type"] == "ra" else ()  # each idea's declarations (ra_model.IDEAS)
    builds = cfg["attn_impl"] == "manual" or (device_type == "cpu" and cfg["dropout"] > 0)
    per_softmax = max([int(builds)] + [idea.kept_scores(cfg) for idea in ideas])
    if not per_softmax:
        return 0, 0
    elements = tokens * cfg["block_size"] * cfg["n_head"]
    streams = max([1] + [idea.score_streams(cfg) for idea in ideas if idea.score_streams])
    kept = 0 if cfg["attn_recompute"] else streams * elements * ((9 if cfg["dropout"] > 0 else 4) + 4 * (per_softmax - 1))
    return kept, 2 * streams * elements * 4


RESERVE_BYTES = 2**30  # a GPU's workspaces, NCCL buffers and allocator fragmentation: a stated allowance
# Bytes per logit (tokens x vocab_size) that the full head holds at its peaks, measured by counting the live
# tensors of model.GPT.head under a training step (tests/test_head_memory.py, docs/speed-and-memory.md):
# float32 logits 8 forward (logits, saved log-softmax) and 12 backward (the saved log-softmax, the NLL's
# float32 gradient, log-softmax-backward's output); bfloat16 autocast 10 forward (bf16 logits, their float32
# copy, log-softmax) and 12 backward. The estimate takes the larger, 12, whatever the dtype.
FULL_HEAD_BYTES_PER_LOGIT = dict(forward=10, backward=12)


def memory_estimate(cfg, n_params, world_size, dtype, device_type="cuda"):
    """Bytes per GPU of the parameters, gradients, optimizer states, the blocks' activations, the
    head's logits and an evaluation's logits for the run's layout, and the peaks they add up to.

    Master weights, gradients and Adam's two moments are float32 (4 bytes each); DDP replicates
    them, FSDP divides them by the shard group and adds the all-gathered weights of two blocks in
    the compute dtype (the running block and the prefetched next one). Gradient accumulation
    without sync keeps a full-size float32 gradient until the last micro-step. Activations follow
    Korthikanti et al. (2022), flash/SDPA attention (no T x T scores kept): per layer and token
    about 34 x n_embd bytes at 2-byte precision, double at float32; with activation_checkpointing
    only each block's input is kept plus one block's activations in the recomputation. Attention
    that materializes its T x T weights adds them (`attention_weights`, on `device_type`). The full
    head peaks at FULL_HEAD_BYTES_PER_LOGIT's larger value (12 bytes per logit, measured: in backward the
    saved float32 log-softmax, the NLL's float32 gradient and log-softmax-backward's output), gone before
    the first block is recomputed; head_loss 'chunked' (and the CUDA kernels 'liger', 'cce') hold one
    chunk of logits (compute dtype), its float32 probabilities and its gradient, plus a float32
    gradient of the head's weight. Evaluation keeps no activations but the whole logits of a
    batch: the model's output, cross_entropy's float32 copy and its float32 log-softmax. `step` is
    a training step's peak (on CPU within 25% of the profiler's measured peak, tests/test_sharding.py),
    `total` the larger of it and an evaluation's.

    What the allocator holds besides (`overhead`): DDP's gradient buckets on several ranks (a float32
    copy of the gradients: gradient_as_bucket_view is off), autocast's 16-bit copies of the weights
    (cached for the forward and kept for the backward; FSDP gathers 16-bit weights instead), and on a
    GPU a reserve for cuBLAS/cuDNN workspaces, NCCL's buffers and the caching allocator's
    fragmentation (RESERVE_BYTES; not measured on hardware here). The CUDA context is outside the
    allocator: check_memory compares against the memory free once it exists.
    """
    bytes_ = 2 if dtype in ("bfloat16", "float16") else 4
    tokens = cfg["batch_size"] * cfg["block_size"]
    n_layer, width, vocab = cfg["n_layer"], cfg["n_embd"], cfg["vocab_size"]
    states = {"sgd": 1 if cfg["momentum"] else 0}.get(cfg["optimizer"], 2)
    shards = 1 if cfg["data_parallel"] == "ddp" else shard_size(cfg, world_size) if world_size > 1 else 1
    accum_local = max(1, cfg["gradient_accumulation_steps"] // max(1, world_size // cfg["tp_size"]))
    block_params = 12 * width * width + 13 * width  # attention (4 C^2) + MLP (8 C^2) + biases and norms
    params = 4 * n_params / shards
    if shards > 1:
        params += 2 * block_params * bytes_
    grads = 4 * n_params / shards + (4 * n_params if shards > 1 and accum_local > 1 else 0)
    optimizer = 4 * states * n_params / shards
    weights_kept, weights_peak = attention_weights(cfg, tokens, device_type)
    per_layer = 34 * width * tokens * bytes_ // 2 + weights_kept
    if cfg["head_loss"] == "full":
        head = max(FULL_HEAD_BYTES_PER_LOGIT.values()) * vocab * tokens
    else:
        head = min(tokens * vocab, CHUNK_LOGITS) * (2 * bytes_ + 4) + 4 * vocab * width
    if cfg["activation_checkpointing"]:
        activations = n_layer * width * tokens * bytes_ + per_layer
        peak_activations = activations - per_layer + max(per_layer + weights_peak, head)
    else:
        activations = n_layer * per_layer
        peak_activations = activations + max(weights_peak, head)
    evaluation = tokens * vocab * (bytes_ + 8)
    estimate = dict(params=params, grads=grads, optimizer=optimizer, activations=activations, head=head,
                    evaluation=evaluation)
    buckets = 4 * n_params / cfg["tp_size"] if cfg["data_parallel"] == "ddp" and world_size // cfg["tp_size"] > 1 else 0
    autocast_copies = 2 * n_params if bytes_ == 2 and shards == 1 else 0
    overhead = buckets + autocast_copies + (RESERVE_BYTES if device_type == "cuda" else 0)
    estimate["overhead"] = overhead
    held = params + grads + optimizer + overhead
    estimate |= dict(step=held + peak_activations, total=held + max(peak_activations, evaluation))
    return {k: int(v) for k, v in estimate.items()}


def describe_memory(estimate):
    unit, size = ("GiB", 2**30) if estimate["total"] >= 2**30 else ("MiB", 2**20)
    return ", ".join(f"{k} {v / size:.2f}" for k, v in estimate.items()) + f" {unit} per GPU"


# ----------------------------------------------------------------------------- does the run fit
# The estimate against the memory there is, before anything is allocated: refuse a run that cannot
# fit, and settle head_loss='auto' (the full head where its logits fit, else the chunked one).

# head_loss='auto' takes the full head where the run's memory estimate times this fits: the tolerance
# the estimate is held to against the allocator's measured peaks (tests/test_sharding.py, gpu_check.py)
FULL_HEAD_MARGIN = 1.25


def gib(n_bytes):
    return f"{n_bytes / 2**30:,.1f} GiB"


def memory_per_rank(cfg, layout, n_params, dtype):
    """Bytes per rank (memory_estimate) on a started ParallelLayout; a real tensor-parallel rank holds 1/tp
    of the weights."""
    return memory_estimate(cfg, n_params // (layout.tp if layout.tp_group is not None else 1),
                           layout.world_size, dtype, layout.device.split(":")[0])


def available_memory(device):
    """(bytes, where): a GPU's free memory plus what this process's allocator already holds (the
    estimate counts those tensors; not the total: the CUDA context, created by now, and other
    processes' memory are not ours), or this machine's RAM shared by the ranks on it."""
    if device.startswith("cuda"):
        free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device)
        return free, f"the free memory of {device}"
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // ranks_here
    return available, "this machine's RAM" + (f" per rank ({ranks_here} ranks)" if ranks_here > 1 else "")


def check_memory(cfg, layout, n_params, dtype):
    """Refuse a run whose estimated peak (a training step's or an evaluation's) exceeds the device's
    memory (a CPU's RAM shared by its ranks), before anything is allocated. head_loss='auto' is
    estimated as the chunked head, the one it falls back to (choose_head_loss)."""
    available, where = available_memory(layout.device)
    needed = memory_per_rank(cfg, layout, n_params, dtype)
    if needed["total"] > available:
        evaluating = needed["total"] > needed["step"]
        parts = ", ".join(f"{k} {gib(needed[k])}" for k in ("params", "grads", "optimizer", "overhead") + (
            ("evaluation",) if evaluating else ("activations", "head")))
        fix = ("lower batch_size or block_size (evaluation holds their vocab_size logits at once)" if evaluating else
               "shrink the model, lower batch_size or block_size, or turn on activation_checkpointing")
        raise configurator.ConfigError(f"this run needs at least {gib(needed['total'])} per rank ({parts}) but "
                                       f"{where} is {gib(available)}: {fix}")


@dataclasses.dataclass
class HeadChoice:
    """The head a training step uses and why: `reason` is 'as set' (head_loss was not 'auto'), 'cpu',
    'fits' or 'exceeds' (the full head's estimate x margin against `available` bytes on `device`)."""
    head_loss: str
    reason: str
    needed: float = None  # bytes: the estimate with the full head's logits, times margin
    available: int = None
    margin: float = FULL_HEAD_MARGIN
    device: str = ""


def choose_head_loss(cfg, layout, n_params, dtype, available=None):
    """The HeadChoice. head_loss='auto' takes the full head on a GPU when the memory estimate of the
    run with its logits (the measured FULL_HEAD_BYTES_PER_LOGIT, 12 bytes per logit at the backward peak) fits the free memory (`available`,
    by default available_memory()) with FULL_HEAD_MARGIN to spare: one matmul each way, where the
    chunked head adds each chunk's weight gradient into a float32 (vocab, n_embd) buffer (its cost:
    docs/speed-and-memory.md). Otherwise, and on CPUs (where the chunked head is no slower), 'chunked'.
    Any other value is kept."""
    if cfg["head_loss"] != "auto":
        return HeadChoice(cfg["head_loss"], "as set")
    if not layout.device.startswith("cuda"):
        return HeadChoice("chunked", "cpu", device=layout.device)
    if available is None:
        available = available_memory(layout.device)[0]
    full = FULL_HEAD_MARGIN * memory_per_rank(dict(cfg, head_loss="full"), layout, n_params, dtype)["total"]
    fits = full <= available
    return HeadChoice("full" if fits else "chunked", "fits" if fits else "exceeds", full, available,
                      device=layout.device)
