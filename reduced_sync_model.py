"""GPT-2 with fewer tensor-parallel synchronization points: TP (Megatron), SPD and parallel blocks.

One model, two executions:
- real: the model lives on the tp_size ranks of a process group; each rank holds only its shard of
  the attention heads and MLP columns, and the sync points are `dist.all_reduce` calls (gloo on
  CPU, nccl on GPU);
- simulated: one process holds every shard (the full GPT-2 weights) and sums the shards' partial
  outputs at the same sync points.
Both count their all-reduces per forward pass (forward and backward separately); `metrics()`
reports them and `startup_report()` checks them against the expected number.

Block types (p = tp_size, shard i = rank i's heads and MLP columns; see docs/experiments.md):
- tp: Megatron. x = x + g(attn_i(f(LN1(x)))) + b_o, then the same for the MLP. f is identity
  forward / all-reduce of the gradient backward, g the reverse: 2 all-reduces forward, 2 backward.
- spd: Sync-Point Drop, one sync. a_i = attn_i(LN1(x)) (unsummed partial),
  z_i = mlp_i(LN2(x + a_i + b_o)) + a_i, x = x + sum_i z_i + b_o + b_mlp.
- parallel: a run of consecutive parallel blocks keeps one residual stream per rank,
  s_i = x + (rank i's partial outputs) + biases, and merges them once at the run's end:
  x = x + sum_i d_i + sum of biases, where d_i holds rank i's partial outputs only. Merging deltas
  counts the run's input x once (merging the streams themselves would count it p times) and every
  bias once. A run ends before a tp or spd block, at the last layer, after every `sync_every`
  layers and after each layer in `sync_layers`; a lone parallel block costs one sync like an spd
  block (an spd block *is* a one-block run).
Every local run enters through one f over the run's input and the replicated parameters it uses
locally (layer norms, biases): its backward all-reduces their gradients in one call, so replicated
parameters get the full gradient, identical on every rank, and the run costs 1 sync backward.

The model boundaries add no all-reduce: embeddings, final layer norm and head are replicated (each
rank computes them in full).

Dropout (Megatron's tensor-parallel RNG): a replicated tensor (embeddings, a tp block's summed
sublayer output) draws its mask from the default random stream, which is identical on the ranks of
one replica, so they all drop the same entries. Shard i's own computations (its heads' attention
weights; in spd and parallel blocks also its partial attention and MLP outputs) draw from shard i's
stream instead, so different heads and columns get independent masks. Each training forward pass
takes one seed from the default stream; the stream of (layer, sublayer, shard i) is the default
generator seeded with seed + its index, forked for that computation alone. A real rank runs only its
shard's streams, the simulation runs every shard's in turn: the same masks, so both compute the same
numbers with dropout on. A resumed run restores the default stream and with it every shard's. Per optimizer step, gradient
clipping (sharding.clip_grad_norm) adds one scalar all-reduce, and data parallelism adds DDP's gradient all-reduce over the dp group.
"""
import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from configurator import ConfigError
from model import GPT, GPTConfig, attention_core, causal_attention

BLOCK_TYPES = ("tp", "spd", "parallel")


@dataclass
class ReducedSyncConfig(GPTConfig):
    block_pattern: str = "tp"  # the repeating unit of block types, comma-separated: "spd", "tp,spd" ...
    block_types: list = field(default_factory=list)  # one type per layer; overrides block_pattern
    tp_size: int = 1  # ranks per model replica (real) or shards summed in one process (simulated)
    sync_every: int = 0  # >0: parallel runs also end every N layers (grouped)
    sync_layers: list = field(default_factory=list)  # parallel runs also end after these layers (selective)

    def __post_init__(self):
        super().__post_init__()
        check_reduced_sync_config(self)


def layer_types(cfg):
    """One block type per layer: block_types if given, else block_pattern repeated."""
    if cfg.block_types:
        return list(cfg.block_types)
    unit = [t.strip() for t in cfg.block_pattern.split(",")]
    return (unit * math.ceil(cfg.n_layer / len(unit)))[:cfg.n_layer]


def check_reduced_sync_config(cfg):
    types = layer_types(cfg)
    bad = sorted(set(types) - set(BLOCK_TYPES))
    if bad:
        raise ConfigError(f"block_pattern/block_types name unknown block types {bad}: use {BLOCK_TYPES}")
    if len(types) != cfg.n_layer:
        raise ConfigError(f"block_types has {len(types)} entries but n_layer={cfg.n_layer}")
    if not cfg.block_types and cfg.n_layer % len(cfg.block_pattern.split(",")):
        raise ConfigError(f"block_pattern={cfg.block_pattern!r} does not divide n_layer={cfg.n_layer} evenly: "
                         f"list every layer in block_types instead")
    if cfg.tp_size < 1 or cfg.n_head % cfg.tp_size:
        raise ConfigError(f"tp_size={cfg.tp_size} must divide n_head={cfg.n_head} (each rank owns whole heads)")
    if cfg.sync_every < 0:
        raise ConfigError(f"sync_every must be >= 0, got {cfg.sync_every}")
    for layer in cfg.sync_layers:
        if not 0 <= layer < cfg.n_layer:
            raise ConfigError(f"sync_layers contains {layer}, but the model has {cfg.n_layer} layers")
    if cfg.ln_placement != "pre":
        raise ConfigError("reduced_sync models are pre-LN (the SPD formula needs it): set ln_placement='pre'")
    if cfg.activation_checkpointing:
        raise ConfigError("activation_checkpointing would repeat the all-reduces in backward: set it False "
                         "for reduced_sync models")


def schedule(cfg):
    """The model as segments between sync points: ('tp', [i]) or ('run', [i, j, ...])."""
    types, segments, run = layer_types(cfg), [], []
    for i, t in enumerate(types):
        if t == "tp":
            segments.append(("tp", [i]))
            continue
        run.append(i)
        if (t == "spd" or i == len(types) - 1 or types[i + 1] != "parallel" or i in cfg.sync_layers
                or (cfg.sync_every and (i + 1) % cfg.sync_every == 0)):
            segments.append(("run", run))
            run = []
    return segments


def expected_syncs(cfg):
    """All-reduces per forward pass (and, equally, per backward pass) inside the model."""
    return sum(2 if kind == "tp" else 1 for kind, _ in schedule(cfg))


# ----------------------------------------------------------------------------- sync points

# The reduced-sync experiments in config/: file name -> all-reduces per forward pass that its name
# promises. test_all_architectures.py checks each promise and tools/bench_comm.py times each schedule.
REDUCED_SYNC_CONFIGS = {
    "train_gpt2_24comm": 24, "train_gpt2_18comm": 18, "train_gpt2_16comm": 16, "train_gpt2_12comm": 12,
    "train_gpt2_8comm": 8, "train_gpt2_6comm": 6, "train_spd_12sync": 12, "train_grouped_6sync": 6,
    "train_grouped_4sync": 4, "train_grouped_3sync": 3, "train_grouped_2sync": 2, "train_selective_9sync": 9,
}
SYNC_KEYS = ("block_pattern", "block_types", "tp_size", "sync_every", "sync_layers")  # what a schedule is made of


@contextmanager
def seeded_stream(seed, device):
    """Run the body on the default generator of `device` (and the CPU's) seeded with `seed`; the
    generators' states are restored afterwards, as if the body had drawn nothing."""
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(seed)
        if cuda:
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        yield


def new_record():
    return dict(forward=0, backward=0, forward_bytes=0, backward_bytes=0)


def count(record, direction, tensor):
    """One all-reduce in the record, in eager execution only: a Python dict mutated inside a compiled
    autograd Function is a graph break at every sync point. Compiled steps keep the start-up step's
    counts (startup_report checks them against the schedule, eagerly, before compiling)."""
    if not torch.compiler.is_compiling():
        record[direction] += 1
        record[f"{direction}_bytes"] += tensor.numel() * tensor.element_size()


class _SumForward(torch.autograd.Function):
    """g: all-reduce forward, identity backward. The gradient of a sum with respect to each
    rank's summand is the output gradient itself; all-reducing it too (what the autograd-aware
    functional collectives do) would scale every gradient by the world size."""

    @staticmethod
    def forward(ctx, x, group, record):
        x = x.contiguous().clone()
        if group is not None:
            dist.all_reduce(x, group=group)
        count(record, "forward", x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _SumBackward(torch.autograd.Function):
    """f over several tensors: identity forward, one all-reduce of all their gradients backward
    (flattened into one buffer, so a run of blocks costs one call)."""

    @staticmethod
    def forward(ctx, group, record, *xs):
        ctx.group, ctx.record = group, record
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        dtype = grads[0].dtype
        for g in grads[1:]:
            dtype = torch.promote_types(dtype, g.dtype)
        flat = torch.cat([g.reshape(-1).to(dtype) for g in grads])
        if ctx.group is not None:
            dist.all_reduce(flat, group=ctx.group)
        count(ctx.record, "backward", flat)
        out = [chunk.view_as(g).to(g.dtype) for chunk, g in zip(flat.split([g.numel() for g in grads]), grads)]
        return (None, None, *out)


# ----------------------------------------------------------------------------- sharding

# parameter name suffix -> (dimension split across ranks, segments sharded separately)
SHARDED = {
    "attn.c_attn.weight": (0, 3),  # q, k and v rows, each split by heads
    "attn.c_attn.bias": (0, 3),
    "attn.c_proj.weight": (1, 1),  # row-parallel: input columns
    "mlp.c_fc.weight": (0, 1),  # column-parallel: output rows
    "mlp.c_fc.bias": (0, 1),
    "mlp.c_proj.weight": (1, 1),
}


def sharding_of(name):
    return next((spec for suffix, spec in SHARDED.items() if name.endswith(suffix)), None)


def shard_tensor(name, full, rank, p):
    """Rank `rank`'s slice of a full (GPT-layout) tensor; replicated tensors come back whole."""
    spec = sharding_of(name)
    if spec is None:
        return full
    dim, segments = spec
    return torch.cat([seg.chunk(p, dim)[rank] for seg in full.chunk(segments, dim)], dim)


def unshard_tensor(name, shards):
    """The full tensor from every rank's slice (inverse of shard_tensor)."""
    spec = sharding_of(name)
    if spec is None:
        return shards[0]
    dim, segments = spec
    pieces = [s.chunk(segments, dim) for s in shards]
    return torch.cat([torch.cat([p[j] for p in pieces], dim) for j in range(segments)], dim)


# ----------------------------------------------------------------------------- the model

class ReducedSyncGPT(GPT):
    """GPT-2 whose blocks are tp / spd / parallel; real on `tp_group`, else simulated.

    The parameters are model.py's Blocks (same names, shapes and initialization as GPT), so a
    simulated model's state_dict is a GPT state_dict, and with the same seed a real model's shards
    are slices of the simulated model's weights.
    """

    # tp_block and local_run read the blocks' weights directly: FSDP shards the model as one unit
    blocks_run_as_modules = False

    def __init__(self, config, tp_group=None):
        super().__init__(config)
        self.tp_group = tp_group
        self.segments = schedule(config)
        # The whole residual stream exists only after each segment's sync: an Identity there gives
        # forward hooks (activation norms) a module to watch; no parameters, the state_dict is GPT's.
        self.sync_points = nn.ModuleDict({str(layers[-1]): nn.Identity() for _, layers in self.segments})
        self._full_params = sum(p.numel() for p in self.parameters())
        self.last_record = self.train_record = new_record()
        self.shard_seed = None  # set by each training forward pass with dropout (see the docstring)
        if tp_group is None:
            self.tp_rank, self.held = 0, config.tp_size  # one process holds every shard
            return
        if dist.get_world_size(tp_group) != config.tp_size:
            raise ValueError(f"tp_size={config.tp_size} but the tensor-parallel group has "
                             f"{dist.get_world_size(tp_group)} ranks")
        self.tp_rank, self.held = dist.get_rank(tp_group), 1
        self.load_full_state_dict(self.state_dict())

    @property
    def real(self):
        return self.tp_group is not None

    # -------------------------------------------------------------- weights

    def load_full_state_dict(self, state_dict):
        """Load a full (GPT-layout) state dict, keeping this rank's shards when real."""
        own = self.state_dict()
        with torch.no_grad():
            for name, param in self.named_parameters():
                value = state_dict[name]
                if self.real:
                    value = shard_tensor(name, value, self.tp_rank, self.config.tp_size)
                if param.shape != value.shape:
                    param.data = torch.empty_like(value, device=param.device)  # full -> shard
                param.copy_(value)
        missing = set(own) - set(state_dict)
        if missing:
            raise KeyError(f"state dict lacks {sorted(missing)}")

    def full_state_dict(self, state=None):
        """The full (GPT-layout) state dict of this model's state dict, or of `state` (its weights
        gathered from FSDP's shards); real models all-gather their shards (every rank of the
        tensor-parallel group must call this)."""
        state = self.state_dict() if state is None else state
        if not self.real:
            return state
        full = {}
        for name, tensor in state.items():
            if sharding_of(name) is None:
                full[name] = tensor
                continue
            shards = [torch.empty_like(tensor) for _ in range(self.config.tp_size)]
            dist.all_gather(shards, tensor.contiguous(), group=self.tp_group)
            full[name] = unshard_tensor(name, shards)
        return full

    def get_num_params(self, non_embedding=True):
        """The full model's count (a real rank holds only part of it)."""
        return self._full_params - (self.transformer.wpe.weight.numel() if non_embedding else 0)

    def is_sharded(self, name):
        return sharding_of(name) is not None

    # -------------------------------------------------------------- sync points

    def sync_sum(self, partials):
        """g: the sum of the shards' partial outputs (one all-reduce when real)."""
        if self.real:
            return _SumForward.apply(partials[0], self.tp_group, self.record)
        total = partials[0]
        for p in partials[1:]:
            total = total + p
        return _SumForward.apply(total, None, self.record)

    def sync_grads(self, *tensors):
        """f: enter rank-local computation; backward all-reduces the tensors' gradients."""
        return _SumBackward.apply(self.tp_group, self.record, *tensors)

    # -------------------------------------------------------------- shard computations

    def shard_stream(self, layer, sublayer, r, like):
        """The random stream of held shard r's computation in one sublayer (0: attention, 1: MLP)."""
        if self.shard_seed is None:
            return nullcontext()
        shard = self.tp_rank + r  # a real rank holds one shard, its own; the simulation holds all
        index = (2 * layer + sublayer) * self.config.tp_size + shard
        return seeded_stream(self.shard_seed + index, like.device)

    def attn_partial(self, block, r, h):
        """Shard r's heads: attention of h, through its slice of c_proj, without c_proj's bias."""
        w_qkv, b_qkv = block.attn.c_attn.weight, block.attn.c_attn.bias
        width = w_qkv.shape[0] // 3 // self.held
        if self.held > 1:  # simulated: shard r's q, k and v rows
            rows = lambda t: torch.cat([t[(j * self.held + r) * width:(j * self.held + r + 1) * width]
                                        for j in range(3)])
            w_qkv, b_qkv = rows(w_qkv), None if b_qkv is None else rows(b_qkv)
        qkv = F.linear(h, w_qkv, b_qkv)
        B, T, _ = h.shape
        heads = self.config.n_head // self.config.tp_size
        q, k, v = (t.view(B, T, heads, width // heads).transpose(1, 2) for t in qkv.split(width, dim=2))
        dropout = self.config.dropout if self.training else 0.0
        attend = lambda q, k, v: causal_attention(q, k, v, self.config.attn_impl, dropout)
        y = attention_core(attend, q, k, v, recompute=self.config.attn_recompute and self.training)
        y = y.transpose(1, 2).reshape(B, T, width)
        return F.linear(y, block.attn.c_proj.weight[:, r * width:(r + 1) * width])

    def mlp_partial(self, block, r, h):
        """Shard r's MLP columns, without c_proj's bias."""
        w_fc, b_fc = block.mlp.c_fc.weight, block.mlp.c_fc.bias
        width = w_fc.shape[0] // self.held
        cols = slice(r * width, (r + 1) * width)
        u = block.mlp.gelu(F.linear(h, w_fc[cols], None if b_fc is None else b_fc[cols]))
        return F.linear(u, block.mlp.c_proj.weight[:, cols])

    @staticmethod
    def add_bias(x, linear):
        return x if linear.bias is None else x + linear.bias

    # -------------------------------------------------------------- blocks

    def tp_block(self, layer, block, x):
        """Megatron: two syncs, each sublayer's output summed over the shards (then its bias)."""
        for sublayer, (ln, partial, proj, drop) in enumerate((
                (block.ln_1, self.attn_partial, block.attn.c_proj, block.attn.resid_dropout),
                (block.ln_2, self.mlp_partial, block.mlp.c_proj, block.mlp.dropout))):
            (h,) = self.sync_grads(ln(x))
            partials = []
            for r in range(self.held):
                with self.shard_stream(layer, sublayer, r, h):
                    partials.append(partial(block, r, h))
            x = x + drop(self.add_bias(self.sync_sum(partials), proj))  # replicated: the default stream
        return x

    def local_run(self, layers, x):
        """Consecutive spd/parallel blocks: one stream per shard, merged by one sync at the end."""
        blocks = [self.transformer.h[i] for i in layers]
        replicated = [t for b in blocks for t in (b.ln_1.weight, b.ln_1.bias, b.ln_2.weight, b.ln_2.bias,
                                                   b.attn.c_proj.bias, b.mlp.c_proj.bias) if t is not None]
        x_in, *local = self.sync_grads(x, *replicated)
        local = iter(local)
        local_params = [{name: next(local) if t is not None else None for name, t in
                         (("ln_1.w", b.ln_1.weight), ("ln_1.b", b.ln_1.bias), ("ln_2.w", b.ln_2.weight),
                          ("ln_2.b", b.ln_2.bias), ("b_o", b.attn.c_proj.bias), ("b_mlp", b.mlp.c_proj.bias))}
                        for b in blocks]
        deltas = []
        for r in range(self.held):
            s, d = x_in, 0
            for layer, b, lp in zip(layers, blocks, local_params):
                with self.shard_stream(layer, 0, r, s):
                    a = b.attn.resid_dropout(self.attn_partial(b, r, self.layer_norm(s, lp["ln_1.w"], lp["ln_1.b"])))
                s = s + a if lp["b_o"] is None else s + a + lp["b_o"]
                with self.shard_stream(layer, 1, r, s):
                    m = b.mlp.dropout(self.mlp_partial(b, r, self.layer_norm(s, lp["ln_2.w"], lp["ln_2.b"])))
                s = s + m if lp["b_mlp"] is None else s + m + lp["b_mlp"]
                d = d + a + m
            deltas.append(d)
        x = x + self.sync_sum(deltas)
        for b in blocks:  # biases once, after the sync, from the replicated parameters
            x = self.add_bias(self.add_bias(x, b.attn.c_proj), b.mlp.c_proj)
        return x

    @staticmethod
    def layer_norm(x, weight, bias):
        return F.layer_norm(x, weight.shape, weight, bias, 1e-5)

    def forward(self, idx, targets=None, last_only=False):
        """As GPT.forward, with the blocks executed segment by segment between sync points."""
        x = self.embed(idx)
        if not torch.compiler.is_compiling():  # a compiled step counts nothing (see count)
            self.record = self.last_record = new_record()
            if self.training and torch.is_grad_enabled():
                self.train_record = self.record
        self.shard_seed = None
        if self.training and self.config.dropout > 0:  # one draw from the replica's stream
            self.shard_seed = int(torch.randint(0, 2**62, ()))
        h = self.transformer.h
        for kind, layers in self.segments:
            x = self.tp_block(layers[0], h[layers[0]], x) if kind == "tp" else self.local_run(layers, x)
            x = self.sync_points[str(layers[-1])](x)
        return self.head(x, targets, last_only)

    def residual_layer(self, layer):
        """Inside a parallel run each shard has its own stream: the run's last layer, after its sync."""
        return next(layers[-1] for _, layers in self.segments if layer in layers)

    def residual_module(self, layer):
        return self.sync_points[str(layer)]

    # -------------------------------------------------------------- reporting

    def metrics(self):
        """All-reduces of the latest training micro-step (forward and backward) and their volume."""
        rec = self.train_record
        return dict(syncs_forward=rec["forward"], syncs_backward=rec["backward"],
                    syncs_expected=expected_syncs(self.config),
                    allreduce_mib_forward=rec["forward_bytes"] / 2**20,
                    allreduce_mib_backward=rec["backward_bytes"] / 2**20)

    def startup_report(self, device):
        """Count the syncs of one tiny forward + backward and check them against the schedule;
        the RNG state and gradients are left as they were. Every rank of the group must call it."""
        cfg = self.config
        idx = torch.zeros(1, min(8, cfg.block_size), dtype=torch.long, device=device)
        devices = [torch.device(device)] if str(device).startswith("cuda") else []
        with torch.random.fork_rng(devices=devices):
            _, loss = self(idx, idx)
            loss.backward()
        for p in self.parameters():
            p.grad = None
        rec, expected = self.train_record, expected_syncs(cfg)
        if rec["forward"] != expected or rec["backward"] != expected:
            raise RuntimeError(f"measured {rec['forward']} all-reduces forward and {rec['backward']} backward, "
                               f"expected {expected}: the schedule and the execution disagree")
        return {
            "block_types": ",".join(layer_types(cfg)), "tp_size": cfg.tp_size,
            "tp_execution": "real (one shard per rank)" if self.real else "simulated (all shards in one process)",
            "syncs_per_forward": f"{rec['forward']} measured / {expected} expected (model-internal all-reduces)",
            "syncs_per_backward": f"{rec['backward']} measured / {expected} expected",
            "boundary_syncs": "0 per pass (embeddings, ln_f, head replicated); per step: 1 scalar all-reduce "
                              "(gradient norm) over tp, DDP gradient all-reduce and loss all-reduce over dp",
        }
