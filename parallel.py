"""How a run's ranks share the work, decided once: the ParallelLayout, and where checkpoints live.

    layout = ParallelLayout.plan(cfg, world_size)   # checks every degree; no process group yet
    layout.start(cfg["device"], cfg["dist_timeout"]) # under torchrun: the process group and one mesh
    model = layout.wrap(raw_model, dtype, cfg)       # DDP, FSDP, HSDP or 3-D; compiled where asked

Ranks are ordered (replicate, shard, tp) with tp innermost: a tensor-parallel replica's ranks are
consecutive, data parallelism runs across replicas (dp = world / tp), and FSDP/HSDP shard over the
data-parallel ranks that hold the same tensor-parallel position (sharding.py). One device mesh holds
those dimensions; the layout hands out its groups. The training loop asks the layout how to wrap
the model, when gradients are reduced and how to clip them.

The Checkpointer decides when a checkpoint is due, what it holds (the model, the optimizer, every
rank's RNG state, the training Position) and where training goes on from it (a resume, or a
branch's Fork from its trunk); it asks the layout for the collectives and the rank facts.

A run's checkpoint is out_dir/ckpt.pt (one file) or, written by sharded ranks, the directory that
out_dir/dcp/latest names (sharding.py); `rundir.checkpoint_path` is the one place that knows which.

    checkpointer = Checkpointer(cfg, layout)
    position = checkpointer.restore(checkpoint, model, optimizer, pruner, scaler)  # or Position(), or
    fork = checkpointer.continue_trunk(trunk, model, optimizer, loaded)            # a branch's start
    checkpointer.save(position, model, optimizer, stop_reason, scaler=..., ...)    # writes only when due
"""
import dataclasses
import datetime
import os
import re
import sys
import threading
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import configurator
import rundir
import sharding

HEARTBEAT_SECONDS = 1.0

class RankStalled(RuntimeError):
    pass


class ParallelLayout:
    """World size, tensor-parallel size tp, data-parallel size dp = world / tp, and for fsdp/hsdp the
    ranks per shard group (shard) and the shard groups (replicate); after start(), this rank's place."""

    def __init__(self, data_parallel="ddp", world_size=1, tp=1, shard=1):
        self.data_parallel, self.world_size, self.tp, self.shard = data_parallel, world_size, tp, shard
        self.dp = world_size // tp
        self.replicate = self.dp // shard
        self.distributed, self.rank, self.local_rank, self.device = False, 0, 0, "cpu"
        self.timeout = datetime.timedelta(minutes=10)
        self.mesh = self.shard_mesh = self.tp_group = self.dp_group = None

    @classmethod
    def plan(cls, cfg, world_size):
        """The layout of a launch of world_size processes, every degree checked (before any process
        group exists). One process simulates all tp_size shards (ReducedSyncConfig checks that they
        divide the heads); FSDP on one process trains as usual, with sharded checkpoints."""
        err = configurator.ConfigError
        tp = cfg["tp_size"]
        if tp != 1 and cfg["model_type"] != "reduced_sync":
            raise err(f"tp_size={tp} needs model_type='reduced_sync'")
        if world_size > 1 and world_size % tp:
            raise err(f"tp_size={tp} does not divide the world size {world_size}: launch a multiple of {tp} "
                      f"processes or change tp_size")
        sharding.check(cfg)
        if world_size == 1:
            return cls(cfg["data_parallel"])
        shard = 1 if cfg["data_parallel"] == "ddp" else sharding.shard_size(cfg, world_size)
        replicas = world_size // tp
        if shard < 1 or replicas % shard:
            raise err(f"hsdp_shard_size={shard} does not divide the {replicas} data-parallel ranks (world size "
                      f"{world_size} / tp_size {tp}): launch a multiple of it or change hsdp_shard_size "
                      f"(0: the ranks of one node)")
        return cls(cfg["data_parallel"], world_size, tp, shard)

    # ------------------------------------------------------------------------- the launch

    def start(self, device="", timeout=600.0):
        """This process's device and, under torchrun, the process group and the device mesh. A
        collective that waits longer than `timeout` seconds for another rank raises instead of hanging."""
        self.distributed = int(os.environ.get("RANK", -1)) != -1
        self.device = pick_device(device)
        if not self.distributed:
            return self
        self.local_rank = int(os.environ["LOCAL_RANK"])
        if self.device.startswith("cuda"):
            self.device = f"cuda:{self.local_rank}"
            torch.cuda.set_device(self.device)
        self.timeout = datetime.timedelta(seconds=timeout)
        dist.init_process_group(backend=self.backend, timeout=self.timeout)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        start_heartbeat(self.rank)
        if self.backend == "nccl":
            watch_for_stalled_ranks(self.rank, self.world_size, timeout)
        return self.build_mesh()

    @property
    def backend(self):
        return "nccl" if self.device.startswith("cuda") else "gloo"

    def group_options(self):
        """(backend, options) of a mesh's subgroup: the run's dist_timeout, which a subgroup would not
        inherit (it gets the backend's default, 10 minutes for NCCL, 30 for gloo)."""
        options = (dist.ProcessGroupNCCL.Options() if self.backend == "nccl" else dist.ProcessGroupGloo._Options())
        options._timeout = self.timeout
        return self.backend, options

    def build_mesh(self):
        """The one device mesh of a started layout (none for plain DDP), and the groups cut from it,
        each with the run's dist_timeout."""
        dims = self.mesh_dims()
        if dims:
            from torch.distributed.device_mesh import init_device_mesh
            self.mesh = init_device_mesh(self.device.split(":")[0], tuple(dims.values()), mesh_dim_names=tuple(dims),
                                         backend_override={name: self.group_options() for name in dims})
        if self.sharded:
            data_dims = tuple(d for d in dims if d != "tp")
            self.shard_mesh = self.mesh[data_dims] if self.tp > 1 else self.mesh
        if self.tp > 1:
            self.tp_group = self.mesh.get_group("tp")
            data_dims = tuple(d for d in dims if d != "tp")
            self.dp_group = (self.mesh[data_dims]._flatten("dp", backend_override=self.group_options())
                             if len(data_dims) > 1 else self.mesh[data_dims[0]]).get_group()
        return self

    def mesh_dims(self):
        """{dimension: size}, outermost first, or {} when plain DDP over all ranks needs no mesh."""
        dims = {"ddp": {"dp": self.dp}, "fsdp": {"shard": self.shard},
                "hsdp": {"replicate": self.replicate, "shard": self.shard}}[self.data_parallel]
        if self.data_parallel == "ddp" and self.tp == 1:
            return {}
        return dims | ({"tp": self.tp} if self.tp > 1 else {})

    @property
    def master(self):
        return self.rank == 0

    @property
    def dp_rank(self):
        """This rank's data-parallel replica: data, evaluation batches and dropout seeds follow it."""
        return self.rank // self.tp

    @property
    def tp_rank(self):
        return self.rank % self.tp

    @property
    def sharded(self):
        """FSDP/HSDP holds the weights: only with several processes (one shards too little to matter)."""
        return self.distributed and self.data_parallel != "ddp"

    def describe(self):
        return self.data_parallel if self.distributed else "none (one process)"

    # ------------------------------------------------------------------------- training

    def wrap(self, model, dtype, cfg):
        """The model the training step calls: compiled block by block where asked (compile_model), then
        sharded in place (before the optimizer, which must hold the sharded parameters) or wrapped in DDP,
        one gradient bucket per block (ddp_bucket_caps_mb). Each compiled block is its own graph, so DDP's
        hooks run between them and each bucket's all-reduce overlaps the rest of the backward, as eagerly."""
        buckets = ddp_bucket_caps_mb(model)  # from the blocks, before a whole-model compile wraps them
        if cfg["compile"]:
            model = compile_model(model)
        if self.sharded:
            return sharding.shard_model(model, self.shard_mesh, dtype, cfg["fsdp_reduce_dtype"])
        if self.distributed:
            model = DDP(model, device_ids=[self.local_rank] if self.device.startswith("cuda") else None,
                        process_group=self.dp_group, bucket_cap_mb_list=buckets)
        return model

    def gradient_sync(self, model, last):
        """DDP would all-reduce after every backward, FSDP reduce-scatter: only the last micro-step
        needs it (FSDP accumulates the unsharded gradients in fp32 until then)."""
        if self.sharded:
            model.set_requires_gradient_sync(last)
            return nullcontext()
        return model.no_sync() if self.distributed and not last else nullcontext()

    def clip_grad_norm(self, model, max_norm):
        """The whole model's gradient norm, clipped; FSDP's and real tensor-parallel ranks' pieces are
        summed across the ranks that split them (sharding.clip_grad_norm)."""
        if not self.sharded and self.tp_group is None:
            return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return sharding.clip_grad_norm(model, max_norm, self.shard_mesh.get_group("shard") if self.sharded else None)

    def agree_on_skipping(self, scaler, optimizer):
        """float16: GradScaler skips a step whose gradients hold an inf or a NaN, each rank judging the
        gradients it holds. Tensor-parallel and FSDP ranks hold different pieces, so one rank's overflow
        must skip the step on every rank (and lower every rank's scale), or replicated weights drift apart.
        Call after scaler.unscale_(optimizer). (torch's ShardedGradScaler reads the same private state.)"""
        if not (self.distributed and scaler.is_enabled()):
            return
        for found_inf in scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values():
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)

    def all_reduce(self, tensor, mean=False):
        """Sum (or mean) over every rank in place; a no-op on one process."""
        if self.distributed:
            dist.all_reduce(tensor)
            if mean:
                tensor /= self.world_size
        return tensor

    def barrier(self):
        if self.distributed:
            dist.barrier()

    def broadcast_object(self, obj):
        """Rank 0's `obj` on every rank (a picklable value; a no-op on one process)."""
        if not self.distributed:
            return obj
        holder = [obj]
        dist.broadcast_object_list(holder, src=0, device=self.device if self.device.startswith("cuda") else None)
        return holder[0]

    def all_gather_object(self, obj):
        """[every rank's `obj`] in rank order, on every rank ([obj] on one process)."""
        if not self.distributed:
            return [obj]
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def gather_in_tp_group(self, obj):
        """[each tensor-parallel rank's `obj`] on the replica's first tp rank, None on the others."""
        gathered = [None] * self.tp if self.tp_rank == 0 else None
        dist.gather_object(obj, gathered, dst=dist.get_global_rank(self.tp_group, 0), group=self.tp_group)
        return gathered


# ----------------------------------------------------------------------------- checkpoints

@dataclasses.dataclass
class Position:
    """Where training stands: the next step's iteration, the tokens and the seconds trained so far,
    and the best validation loss seen."""
    iter_num: int = 0
    tokens_seen: int = 0
    train_time: float = 0.0
    best_val_loss: float = float("inf")


@dataclasses.dataclass
class Fork:
    """A branch's start from its trunk's final checkpoint (forking.py): the log's fork event."""
    trunk: str
    iter: int
    tokens: int
    train_time: float
    loaded: int  # tensors taken from the trunk
    new: int  # the branch's own new tensors
    optimizer_carried: int  # parameters whose optimizer state carried
    start: str  # fork_start
    best_val_loss: float

    def position(self):
        return Position(self.iter, self.tokens, self.train_time, self.best_val_loss)

    def event(self):
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "best_val_loss"}


def check_resumable(out_dir, data_parallel):
    """init_from='resume' needs a checkpoint of the layout's kind: one line naming the other kind."""
    sharded = data_parallel != "ddp"
    if rundir.checkpoint_path(out_dir, sharded=sharded):
        return
    if not sharded:
        other = " (dcp/ holds a sharded one: resume with data_parallel='fsdp' or 'hsdp', or write a ckpt.pt " \
                "with export_checkpoint.py)" if rundir.checkpoint_path(out_dir, sharded=True) else ""
        raise configurator.ConfigError(f"init_from='resume' but {out_dir}/{rundir.CHECKPOINT_FILE} does not exist{other}")
    raise configurator.ConfigError(f"init_from='resume' with data_parallel={data_parallel!r} but {out_dir}/dcp/"
                                   f"latest does not exist (an ordinary {rundir.CHECKPOINT_FILE} resumes with data_parallel='ddp')")


class Checkpointer:
    """Saves on its own cadence (every eval_interval steps and at the end, when save_checkpoint is on
    and the run has trained since it started or resumed) and restores a run's position."""

    def __init__(self, cfg, layout):
        self.cfg, self.layout = cfg, layout
        self.out_dir, self.interval, self.enabled = cfg["out_dir"], cfg["eval_interval"], cfg["save_checkpoint"]
        self.sharded = cfg["data_parallel"] != "ddp"
        self.start_iter = 0  # the iteration this process started training at: nothing to save before it

    # ------------------------------------------------------------------------- saving

    def due(self, iter_num, stop_reason=None):
        """A checkpoint is due at every evaluation interval and where the run stops."""
        return iter_num % self.interval == 0 or bool(stop_reason)

    def will_save(self, iter_num, stop_reason=None):
        return self.enabled and self.due(iter_num, stop_reason) and iter_num > self.start_iter

    def save(self, position, model, optimizer, stop_reason=None, **state):
        """Write a checkpoint when one is due (collective: every rank calls it); returns whether it did.
        `state`: what else a resume needs (scaler, pruning, metrics)."""
        if not self.will_save(position.iter_num, stop_reason):
            return False
        whole = not (self.layout.sharded or self.layout.tp > 1)
        meta = dict(config=dict(self.cfg), iter_num=position.iter_num, tokens_seen=position.tokens_seen,
                    train_time=position.train_time, best_val_loss=position.best_val_loss,
                    param_names=param_names(model, optimizer) if whole else None, **state)
        self.write(position.iter_num, model, optimizer, meta)
        return True

    def write(self, iter_num, model, optimizer, meta):
        """The model, the optimizer, every rank's RNG state and `meta`. A tensor-parallel model is gathered
        into its full (GPT-layout) weights; its optimizer state stays sharded, one state per tp rank."""
        layout = self.layout
        meta = dict(meta, rng=layout.all_gather_object(rng_state(layout.device)))
        if self.sharded:
            sharding.save(self.out_dir, iter_num, model, optimizer, meta, layout.master, layout.tp_rank)
            return
        model_state, optimizer_state = model.state_dict(), optimizer.state_dict()
        if layout.tp_group is not None:
            # pickled tensors unpickle onto the device they left: CUDA state from rank 3 would land on
            # cuda:3 in rank 0's process (or fail where each process sees one GPU), so it travels on the CPU
            on_cpu = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.cpu(), optimizer_state)
            model_state, optimizer_state = model.full_state_dict(), layout.gather_in_tp_group(on_cpu)
        if layout.master:
            rundir.save_checkpoint(os.path.join(self.out_dir, rundir.CHECKPOINT_FILE),
                                   dict(model=model_state, optimizer=optimizer_state, **meta))

    # ------------------------------------------------------------------------- restoring

    def read(self):
        """The checkpoint's contents; a sharded one's meta.pt with its directory as sharded_path (its
        weights and optimizer state are read once the model is sharded: restore)."""
        path = rundir.checkpoint_path(self.out_dir, sharded=self.sharded)
        if self.sharded:
            return dict(sharding.read_meta(path), sharded_path=path)
        return rundir.load_checkpoint_file(path)

    def restore(self, checkpoint, model, optimizer, pruner, scaler):
        """The optimizer (and a sharded checkpoint's model), the pruning masks, the loss scale and this
        rank's RNG state from `checkpoint`; returns the position to go on from."""
        if "sharded_path" in checkpoint:  # written by any number of ranks
            sharding.load(checkpoint["sharded_path"], model, optimizer, self.layout.tp_rank)
        else:
            optimizer.load_state_dict(self.optimizer_state_of(checkpoint))
        self.restore_rng(checkpoint)
        if pruner is not None and checkpoint.get("pruning"):  # a dense checkpoint starts with no masks
            pruner.load_state_dict(checkpoint["pruning"])
        scaler.load_state_dict(checkpoint["scaler"])
        return self.started(Position(checkpoint["iter_num"], checkpoint["tokens_seen"], checkpoint["train_time"],
                                     checkpoint["best_val_loss"]))

    def continue_trunk(self, trunk, model, optimizer, loaded):
        """A branch's start after forking.load_weights (which counted `loaded`: taken, new): the
        trunk's optimizer state of each shared parameter and its RNG state. Returns the Fork."""
        carried = load_optimizer(trunk, model, optimizer, self.cfg["fork_optimizer"] == "fresh")
        self.restore_rng(trunk)
        fork = Fork(trunk=self.cfg["fork_from"], iter=trunk["iter_num"], tokens=trunk["tokens_seen"],
                    train_time=trunk["train_time"], loaded=loaded[0], new=loaded[1], optimizer_carried=carried,
                    start=self.cfg.get("fork_start", "own"), best_val_loss=trunk["best_val_loss"])
        self.started(fork.position())
        return fork

    def started(self, position):
        self.start_iter = position.iter_num
        return position

    def restore_rng(self, checkpoint):
        """This rank's RNG state; one of another world size is left alone (dropout then differs from an
        uninterrupted run)."""
        if len(checkpoint["rng"]) == self.layout.world_size:
            set_rng_state(checkpoint["rng"][self.layout.rank], self.layout.device)

    def optimizer_state_of(self, checkpoint):
        """This rank's optimizer state; a sharded (list) state resumes only on the same tp layout."""
        state, tp_sharded = checkpoint["optimizer"], self.layout.tp_group is not None
        if isinstance(state, list) != tp_sharded:
            raise configurator.ConfigError(
                "the checkpoint's optimizer state was written " + ("by tensor-parallel ranks" if isinstance(state, list)
                                                                    else "without tensor parallelism")
                + ": resume with the same torchrun layout (world size and tp_size)")
        return state[self.layout.tp_rank] if tp_sharded else state


def rng_state(device):
    """This process's RNG state (the CPU's, and its GPU's)."""
    own = {"torch": torch.get_rng_state()}
    if device.startswith("cuda"):
        own["cuda"] = torch.cuda.get_rng_state(device)
    return own


def set_rng_state(state, device):
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.startswith("cuda"):
        torch.cuda.set_rng_state(state["cuda"], device)


def param_names(model, optimizer):
    """The parameters' names in the optimizer's order (its state is indexed by position): saved with
    every checkpoint so that a branch can match a trunk's state by name."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def load_optimizer(ckpt, model, optimizer, fresh):
    """The trunk's optimizer state of each shared parameter, matched by name (the branch's
    parameter order may differ); the branch's new parameters start with an empty state, as does
    everything with fresh=True. The trunk's group settings and whatever else its state holds
    (AdamW-SPAM's gradient-norm history and reset clock) carry. Returns the parameters carried."""
    if fresh:
        return 0
    trunk_state = ckpt["optimizer"]
    index = {name: i for i, name in enumerate(ckpt["param_names"])}
    own = optimizer.state_dict()
    if len(own["param_groups"]) != len(trunk_state["param_groups"]):
        raise configurator.ConfigError("the branch's optimizer has other parameter groups than its trunk's: use "
                                       "fork_optimizer='fresh'")
    state = {j: trunk_state["state"][index[name]] for j, name in enumerate(param_names(model, optimizer))
             if name in index and index[name] in trunk_state["state"]}
    groups = [dict(theirs, params=mine["params"]) for mine, theirs in zip(own["param_groups"],
                                                                         trunk_state["param_groups"])]
    optimizer.load_state_dict(dict(trunk_state, state=state, param_groups=groups))
    return len(state)


def ddp_bucket_caps_mb(model):
    """DDP's bucket sizes in MiB, one bucket per transformer block. DDP fills a bucket in the order the
    gradients become ready (backward: the last block first) and closes it once it holds its cap: at the
    default 25 MiB, after a 1 MiB first bucket, each of GPT-2 124M's 27.04 MiB blocks was split over two
    buckets (each bucket 27.04 MiB from one block's c_fc, attention and norms to the next's c_proj), so
    every all-reduce waited for part of the next block's backward. Here the caps are the blocks' exact
    sizes, the final norm (and an untied head) with the last block, the embeddings (ready last, with the
    tied head) one bucket of their own. A cap is a block's bytes / 2^20, which DDP multiplies back exactly.
    None (DDP's default buckets) where no bucket reaches DDP's 1 MiB first bucket: a compiled model's graphs
    are split at the largest cap, which Dynamo refuses below that first bucket (the CPU twins' sizes)."""
    block_of = {id(p): i for i, block in enumerate(model.transformer.h) for p in block.parameters()}
    groups = []  # [block index or None, bytes], in the reverse of the registration order, as DDP assigns them
    for p in reversed([p for p in model.parameters() if p.requires_grad]):  # parameters(): a tied head once
        key = block_of.get(id(p))
        if groups and groups[-1][0] == key:
            groups[-1][1] += p.numel() * p.element_size()
        else:
            groups.append([key, p.numel() * p.element_size()])
    if len(groups) > 1 and groups[0][0] is None:  # what follows the blocks (ln_f) goes with the last one
        groups[1][1] += groups.pop(0)[1]
    if max(size for _, size in groups) < dist._DEFAULT_FIRST_BUCKET_BYTES:
        return None
    return [size / 2**20 for _, size in groups]


# ----------------------------------------------------------------------------- compiling

def compile_model(model):
    """Regional compilation (PyTorch's recipe for repeated blocks): each transformer block's forward is
    compiled in place, one graph that every block of the same type reuses, so a cold compile traces one
    block instead of the whole unrolled model. Only the forward: the hooks around it (FSDP's gathers,
    the logged activation norms) run eagerly, and would otherwise give each hooked block its own graph.
    The head (ln_f, lm_head and the loss) is one more region, fullgraph at fixed shapes (compile_head).
    The embeddings stay eager; evaluation's no-grad graphs are compiled at the first evaluation. A model
    that reads its blocks' weights without calling them (reduced_sync) is compiled whole."""
    if not model.blocks_run_as_modules:
        return torch.compile(model)
    for block in model.transformer.h:
        block.forward = torch.compile(block.forward)
    compile_head(model)
    return model


COMPILED_HEADS = ("full", "chunked")  # liger reads a count with .item() (a graph break); both are Triton already


def compile_head(model):
    """model.head compiled as one graph without a break (fullgraph) at fixed shapes (dynamic=False: a
    training step's tokens and evaluation's never change), as a whole-model compile would: the full head's
    float32 logits, log-softmax, NLL and their backward fuse instead of running as separate eager kernels
    (about 15% of a 124M step, issue 59). The chunked head compiles too, its chunk loop unrolled. The head
    must be settled (head_loss='auto' chosen) before this. Generation and HellaSwag (new lengths) run it
    under set_stance('force_eager')."""
    if model.config.head_loss in COMPILED_HEADS:
        model.head = torch.compile(model.head, fullgraph=True, dynamic=False)


# ----------------------------------------------------------------------------- devices and process groups

def pick_device(device):
    """The device to run on: '' picks cuda when available, else cpu; a GPU asked for but absent
    is refused here rather than at the first tensor moved onto it."""
    if not device:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
        raise configurator.ConfigError(f"device={device!r}: use cpu, cuda, cuda:N or mps ('' picks cuda when "
                                       f"there is one, else cpu)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise configurator.ConfigError(f"device={device!r} but no CUDA GPU is visible to this process: "
                                       f"use --device=cpu, or run where a GPU is (check CUDA_VISIBLE_DEVICES)")
    return device


def launched_world_size():
    """torchrun's WORLD_SIZE (1 without it), known before the process group exists."""
    return int(os.environ.get("WORLD_SIZE", 1))


def data_parallel_layout(device=""):
    """The layout of an evaluation script: every rank a data-parallel replica of the whole model."""
    return ParallelLayout(world_size=launched_world_size()).start(device)


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


def stalled_ranks(world_size, timeout):
    """{rank: seconds silent} of the ranks whose heartbeat stopped: a frozen rank has been silent about
    as long as a collective waits for it, a live one a beat or two. Raises when the store is gone."""
    store, now = job_store(), time.time()
    silent = {r: now - float(store.get(f"heartbeat/{r}")) for r in range(world_size)}
    return {r: age for r, age in silent.items() if age > max(3 * HEARTBEAT_SECONDS, timeout / 2)}


def stall_message(rank, world_size, timeout):
    """For watch_for_stalled_ranks: (the stalled ranks, a line naming them) where this is the lowest
    live rank (one rank says it), else (the stalled ranks, None)."""
    stalled = stalled_ranks(world_size, timeout)
    if not stalled or rank != min(set(range(world_size)) - set(stalled), default=None):
        return frozenset(stalled), None
    names = ", ".join(f"rank {r} (silent for {age:.0f} s)" for r, age in sorted(stalled.items()))
    return frozenset(stalled), (f"{names} stopped responding, frozen or stuck outside Python; NCCL's watchdog "
                                f"ends the job once a collective has waited dist_timeout={timeout:g} s for them")


def watch_for_stalled_ranks(rank, world_size, timeout):
    """NCCL's watchdog aborts the process when a collective outlasts dist_timeout, before Python sees an
    error, so name_stalled_ranks never runs there. This thread reads the heartbeats itself and says once
    per stall which ranks went silent (the abort still ends the job)."""
    def watch():
        said = frozenset()
        while True:
            time.sleep(5 * HEARTBEAT_SECONDS)
            try:
                stalled, message = stall_message(rank, world_size, timeout)
            except Exception:  # the store went away: the job is ending
                return
            if message and stalled != said:
                os.write(2, (message + "\n").encode())
            said = stalled
    threading.Thread(target=watch, name="stall-watch", daemon=True).start()


def name_stalled_ranks(error, rank, world_size, timeout):
    """Raise RankStalled naming the ranks whose heartbeat stopped, when `error` (a failed or timed
    out collective) is explained by them; return quietly otherwise, for the caller to re-raise."""
    try:
        stalled = stalled_ranks(world_size, timeout)
    except Exception:
        return
    if not stalled and "timed out" in str(error).lower():
        raise RankStalled(f"rank {rank} waited dist_timeout={timeout:g} s in a collective that the other ranks, "
                          f"all alive, never joined: they disagree on which collective comes next (a bug), or one "
                          f"is busy longer than dist_timeout (raise it)") from None
    if stalled:
        names = ", ".join(f"rank {r} (silent for {age:.0f} s)" for r, age in sorted(stalled.items()))
        raise RankStalled(f"{names} stopped responding, frozen or stuck outside Python; rank {rank} waited "
                          f"dist_timeout={timeout:g} s in a collective and ended the job "
                          f"({str(error).splitlines()[0].rsplit('] ', 1)[-1][:120]})") from None


def exit_distributed(code=0):
    """End a successful distributed run: every rank waits for the others (rank 0 may still be writing
    a checkpoint), then leaves with os._exit, skipping an interpreter finalization that can abort
    while gloo's threads still release the last collectives' tensors. On success only: after an
    error the other ranks may never reach the barrier."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
