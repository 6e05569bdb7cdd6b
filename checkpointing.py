"""A run's checkpoints: when one is due, what it holds, and where training goes on from it.

    checkpointer = Checkpointer(cfg, layout)
    position = checkpointer.restore(checkpoint, model, optimizer, pruner, scaler)  # or Position(), or
    fork = checkpointer.continue_trunk(trunk, model, optimizer, loaded)            # a branch's start
    checkpointer.save(position, model, optimizer, stop_reason, scaler=..., ...)    # writes only when due

A checkpoint holds the model, the optimizer, every rank's RNG state (dropout masks differ per rank)
and the training position, so that a resumed run continues bit for bit. The layout says where it
lives (ckpt.pt, or dcp/ under data_parallel='fsdp'/'hsdp': sharding.py) and runs the collectives;
this module decides what to write and what to restore.
"""
import dataclasses
import os

import torch

import configurator
import rundir
import sharding
from parallel import CHECKPOINT_FILE, checkpoint_path


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
    if checkpoint_path(out_dir, sharded=sharded):
        return
    if not sharded:
        other = " (dcp/ holds a sharded one: resume with data_parallel='fsdp' or 'hsdp', or write a ckpt.pt " \
                "with export_checkpoint.py)" if checkpoint_path(out_dir, sharded=True) else ""
        raise configurator.ConfigError(f"init_from='resume' but {out_dir}/{CHECKPOINT_FILE} does not exist{other}")
    raise configurator.ConfigError(f"init_from='resume' with data_parallel={data_parallel!r} but {out_dir}/dcp/"
                                   f"latest does not exist (an ordinary {CHECKPOINT_FILE} resumes with data_parallel='ddp')")


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
            rundir.save_checkpoint(os.path.join(self.out_dir, CHECKPOINT_FILE),
                                   dict(model=model_state, optimizer=optimizer_state, **meta))

    # ------------------------------------------------------------------------- restoring

    def read(self):
        """The checkpoint's contents; a sharded one's meta.pt with its directory as sharded_path (its
        weights and optimizer state are read once the model is sharded: restore)."""
        path = checkpoint_path(self.out_dir, sharded=self.sharded)
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
