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

The loop (train, at the end) asks its components, each with its own cadence and state: StepMetrics
reads the device only when something needs the numbers and writes the train line, the Evaluator
evaluates when due, the Checkpointer (parallel.py) saves when due and restores the Position;
messages.py writes every sentence from the numbers they return.
"""
import dataclasses
import json
import math
import os
import signal
import sys
import time
import types
from contextlib import nullcontext

import torch

import configurator
import devices
import evaluation
import forking
import messages
import optim
import rundir
import runrecord
import runtime
import sharding
import tokendata
from model import peak_flops
from parallel import (Checkpointer, ParallelLayout, Position, RankStalled, exit_distributed,
                      launched_world_size, name_stalled_ranks)
from tokendata import get_batch, train_offsets


class Interrupted(Exception):
    """A second signal, or one before the first step: the run stops at once, with the shell's exit
    code for that signal."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.exit_code = 128 + signum


EXIT_STOPPED_BY_SIGNAL = 3  # a first signal: the step finished, a checkpoint was written, resume to go on
SAMPLE_PROMPT = "\n"  # the end-of-run sample (sample_tokens) continues a new line
MAX_EXP_ARG = math.log(sys.float_info.max)  # 709.78: a val loss above it has no perplexity a float holds


# ----------------------------------------------------------------------------- the learning rate

def learning_rate_at(cfg, it):
    lr, min_lr, warmup = cfg["learning_rate"], cfg["min_lr"], cfg["warmup_iters"]
    if it < warmup:
        return lr * (it + 1) / warmup
    if cfg["lr_schedule"] == "constant":
        return lr
    end = runtime.decay_iters(cfg)
    if it >= end:
        return min_lr
    if cfg["lr_schedule"] == "cosine":
        progress = (it - warmup) / max(1, end - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
    decay_start = end - int(cfg["wsd_decay_frac"] * end)
    if it < decay_start:
        return lr
    return lr - (lr - min_lr) * (it - decay_start) / max(1, end - decay_start)


# ----------------------------------------------------------------------------- what a step measures
# The host queues step after step while the GPU still runs the earlier ones; a step's loss, gradient
# norm and timer lap stay on the device until a log line, an evaluation or a checkpoint next, the end
# of the budget or a signal to a lone process needs them, and are then read in one go (read_steps), bit
# for bit the values a read after every step gives. max_time is watched on the host's clock every step
# (StepMetrics.time_may_be_spent) and decided on the device's, once read, as before.

class TrainingDiverged(RuntimeError):
    """A loss (or, without a loss scaler, a gradient norm) became non-finite at iteration iter_num, or an
    evaluation's val loss too large for a perplexity: `fields` are the values, the log's diverged event."""

    def __init__(self, iter_num, **fields):
        self.iter_num, self.fields = iter_num, fields
        super().__init__(f"{messages.what_diverged(fields)} at iteration {iter_num}")


def budget_reached(cfg, position):
    """'max_iters', 'max_tokens' or 'max_time' where that budget is spent, else None."""
    if position.iter_num >= cfg["max_iters"]:
        return "max_iters"
    if cfg["max_tokens"] and position.tokens_seen >= cfg["max_tokens"]:
        return "max_tokens"
    if cfg["max_time"] and position.train_time >= cfg["max_time"]:
        return "max_time"
    return None


def read_steps(unread, timer, layout, signalled):
    """[(loss, grad norm, seconds)] of the steps the host has queued since the last read, and whether a
    stop signal reached any rank: one wait for the device and one all-reduce, which gives every rank the
    same losses and the same clock, so all ranks agree on when to stop (a disagreement would hang the
    next collective). The values are the ones each step would have read at once, bit for bit."""
    seconds = [timer.seconds(lap) for _, _, lap in unread]  # waits for the last step's last kernel
    losses = torch.stack([loss for loss, _, _ in unread])
    shared = torch.cat([losses, torch.tensor(seconds + [float(signalled)], device=losses.device)])
    shared = layout.all_reduce(shared, mean=True).tolist()
    grad_norms = torch.stack([grad_norm for _, grad_norm, _ in unread]).tolist()  # equal on every rank
    n = len(unread)
    return list(zip(shared[:n], grad_norms, shared[n:2 * n])), shared[-1] > 0


@dataclasses.dataclass
class Window:
    """The training steps since the last log line."""
    time: float = 0.0  # seconds of device work (the timer's laps)
    iters: int = 0
    peak_mib: float = 0.0
    wall_time: float = 0.0  # host seconds from each first step's start to the read after it, host gaps included


class StepMetrics:
    """Times each step, keeps its loss and gradient norm on the device until they are needed, checks
    them, adds the steps' seconds to the run's training time and writes the train log line."""

    def __init__(self, cfg, layout, raw_model, act_norms, log, dtype, peak_flops, scaler):
        self.cfg, self.layout, self.raw_model, self.act_norms, self.log = cfg, layout, raw_model, act_norms, log
        self.dtype, self.peak_flops, self.scaler = dtype, peak_flops, scaler
        self.timer = devices.DeviceTimer(layout.device)
        self.unread = []  # the steps queued since the host last read the device: (loss, grad norm, timer lap)
        self.window = Window()
        self.step_peak_since_eval = None  # MiB: the memory_ratio's numerator (a training step's, not evaluation's)
        self.peak_reset_due = True  # at the first step and the first after a read (evaluation's peak is logged apart)
        self.wall_start = None  # the host clock when the first step since the last read started
        self.iter_num = None  # the iteration the last step ended at (None before the first)
        self.lr = None
        self.host_started = None
        self.host_unread = 0.0  # seconds the host spent in the unread steps (max_time's watch, time_may_be_spent)

    def start_step(self):
        if self.peak_reset_due:  # evaluation's (a batch's whole logits) and a checkpoint's are not a training step's
            devices.reset_peak_memory(self.layout.device)
            self.peak_reset_due = False
        if self.wall_start is None:
            self.wall_start = time.perf_counter()
        # the activation norms of the steps a log line reads (its latest micro-step's), not of every step
        self.act_norms.active = self.iter_num is None or (self.iter_num + 1) % self.cfg["log_interval"] == 0
        self.host_started = time.perf_counter()  # around the timer's marks: on a CPU a host lap covers its lap
        self.timer.start()

    def end_step(self, loss, grad_norm, lr, position, signals):
        """Queue the step's values (still on the device), move `position` one step on, and read the
        device where something needs the numbers. Returns the stop reason, or None to go on."""
        self.unread.append((loss, grad_norm, self.timer.stop()))
        self.host_unread += time.perf_counter() - self.host_started
        self.lr = lr
        position.iter_num += 1
        self.iter_num = position.iter_num
        position.tokens_seen += self.cfg["tokens_per_iter"]
        signalled = self.read(position, signals) if self.read_due(position, signals) else False
        # a signal first: a run paused in the step that also spent its budget resumes to its final evaluation
        return "signal" if signalled else budget_reached(self.cfg, position)

    def read_due(self, position, signals):
        """A log line, an evaluation or checkpoint next, the end of the budget (max_time by the host's clock),
        a signal to a lone process."""
        cfg, it = self.cfg, position.iter_num
        return (it % cfg["log_interval"] == 0 or it % cfg["eval_interval"] == 0 or it in cfg["eval_at"]
                or budget_reached(cfg, position) is not None or self.time_may_be_spent(position)
                or (signals.received and not self.layout.distributed))

    def time_may_be_spent(self, position):
        """Whether max_time may be spent, by the host's clock: the steps read so far (train_time) plus the
        host's laps of those queued since, no device sync. On a CPU a host lap covers the timer's, so the
        read comes no later than the step that spends the budget; a GPU's queue can trail the host by the
        steps it holds. The read then decides on train_time, so where a run stops is what a read after
        every step gives, and a resumed run counts on from its checkpoint's train_time. Under torchrun
        each rank's clock differs and a read is a collective that every rank must join, so there the
        budget is checked where the ranks read anyway (log steps: log_interval bounds the overshoot)."""
        return (bool(self.cfg["max_time"]) and not self.layout.distributed
                and position.train_time + self.host_unread >= self.cfg["max_time"])

    def read(self, position, signals):
        """Read the queued steps, check them, log at log steps; returns whether any rank was signalled."""
        steps, signalled = read_steps(self.unread, self.timer, self.layout, signals.received is not None)
        self.unread, self.host_unread = [], 0.0
        self.window.wall_time += time.perf_counter() - self.wall_start  # the device has finished the steps
        self.wall_start = None
        self.read_peak()
        for it, (loss, grad_norm, seconds) in enumerate(steps, start=position.iter_num - len(steps) + 1):
            position.train_time += seconds
            self.window.time += seconds
            self.window.iters += 1
            if not math.isfinite(loss) or (not math.isfinite(grad_norm) and not self.scaler.is_enabled()):
                raise TrainingDiverged(it, loss=loss, grad_norm=grad_norm)
        if position.iter_num % self.cfg["log_interval"] == 0:
            self.log_train(position, loss, grad_norm)
        return signalled

    def log_train(self, position, loss, grad_norm):
        step_time = self.window.time / self.window.iters  # the device's (CUDA events): step_time_ms
        tokens_per_iter = self.cfg["tokens_per_iter"]
        # tokens_per_sec (and MFU) by the host's clock from each read to the next, the host's gaps between
        # steps included (the device's laps leave them out): what a run's throughput is
        tokens_per_sec = tokens_per_iter * self.window.iters / self.window.wall_time
        mfu, self.peak_flops = devices.model_flops_utilization(
            self.raw_model, tokens_per_sec / self.layout.world_size, self.layout.device, self.dtype, self.peak_flops)
        record = dict(iter=position.iter_num, tokens=position.tokens_seen, loss=loss, lr=self.lr, grad_norm=grad_norm,
                      **self.act_norms.read(), step_time_ms=1000 * step_time, tokens_per_sec=tokens_per_sec,
                      mfu=mfu, mfu_peak_gflops=self.peak_flops / 1e9 if self.peak_flops else None,
                      peak_memory_mib=self.window.peak_mib, tokens_per_iter=tokens_per_iter,
                      load_average=runrecord.load_average())
        self.log.event("train", messages.train_line(record), **record)
        self.window = Window()
        self.act_norms.active = False  # evaluation's forwards record nothing

    def read_peak(self):
        """The allocator's peak since the steps after the last read began (a host call, but not free: once per
        read, not per step); the window's peak is the max of its reads, the steps' since the last evaluation
        too. The next step resets it: what runs between (an evaluation, a checkpoint) is no step's."""
        step_peak = devices.peak_memory_mib(self.layout.device)
        self.peak_reset_due = True
        self.window.peak_mib = max(self.window.peak_mib, step_peak)
        self.step_peak_since_eval = max(self.step_peak_since_eval or 0.0, step_peak)

    def take_step_peak(self):
        """The highest training step's peak memory (MiB) since the last call (None before any step). Called
        before an evaluation, which resets the peak for its own: the next step starts a new one."""
        peak, self.step_peak_since_eval = self.step_peak_since_eval, None
        self.peak_reset_due = True
        return peak


# ----------------------------------------------------------------------------- what a run evaluates
# Every eval_interval steps, at the eval_at points a report reads and where the run stops: the mean
# loss of train and val windows; HellaSwag every hellaswag_interval steps and at the end; after
# training, a sample of text. A non-finite evaluation loss, or a val loss beyond exp's range, stops the
# run before a checkpoint could replace the last good one.

@torch.no_grad()
def evaluate(model, cfg, layout, data_dir, counts, autocast, final=False):
    """Mean loss over the fixed windows of each split; batches are shared out across replicas. The
    evaluations a report reads (the end of the budget, eval_at) read final_eval_iters val batches where
    that is set."""
    model.eval()
    losses = {}
    for split in ("train", "val"):
        total = torch.zeros(2, device=layout.device)  # loss sum, batch count
        batches = tokendata.eval_offsets(cfg, counts[split], cfg["final_eval_iters"] if final and split == "val" else 0)
        for first in range(0, len(batches), layout.dp):
            k = first + layout.dp_rank  # a replica's tensor-parallel ranks share each batch
            counted = k < len(batches)
            # A sharded model all-gathers in every forward, so every rank must run as many: a rank with
            # no batch left in the last round recomputes batch 0 without counting it.
            if not counted and not layout.sharded:
                continue
            x, y = get_batch(data_dir, split, batches[k if counted else 0], cfg["block_size"], layout.device)
            with autocast:
                _, loss = model(x, y)
            total += float(counted) * torch.stack([loss.float(), torch.ones((), device=layout.device)])
        losses[split] = (layout.all_reduce(total)[0] / total[1]).item()
    model.train()
    return losses


class Evaluator:
    """Evaluates when due and logs each result; `last` is the latest eval record (a checkpoint keeps it)."""

    def __init__(self, cfg, layout, model, raw_model, optimizer, pruner, data, autocast, log, hellaswag=None):
        self.cfg, self.layout, self.model, self.raw_model = cfg, layout, model, raw_model
        self.optimizer, self.pruner, self.autocast, self.log = optimizer, pruner, autocast, log
        self.data = data  # .dir, .counts (tokens per split), .codec (the sample's)
        self.hellaswag = hellaswag  # the examples, on every rank, or None
        self.weights_bytes = sharding.local_weights_bytes(raw_model)  # this rank's: its FSDP or tensor-parallel shards
        self.last = None

    def due(self, iter_num, stop_reason=None):
        """At eval_interval, at eval_at and where the run stops; never after a signal (a preempted job
        has seconds: it saves now and evaluates when it resumes)."""
        return stop_reason != "signal" and (iter_num % self.cfg["eval_interval"] == 0 or bool(stop_reason)
                                            or iter_num in self.cfg["eval_at"])

    def run(self, position, stop_reason, step_peak_mib):
        """Evaluate at `position` (updating its best_val_loss), then HellaSwag where due; returns the eval
        record. step_peak_mib: the highest training step's peak memory since the last evaluation."""
        device, it = self.layout.device, position.iter_num
        devices.reset_peak_memory(device)  # evaluation's peak (a batch's whole logits) is logged apart
        losses = evaluate(self.model, self.cfg, self.layout, self.data.dir, self.data.counts, self.autocast,
                          final=stop_reason is not None or it in self.cfg["eval_at"])
        # never let a NaN model replace a good checkpoint; nor one whose val loss is finite but beyond
        # exp's range (> 709.78, some 65 times the uniform guess's ln(50304)): that model has diverged
        val_ppl = math.exp(losses["val"]) if losses["val"] <= MAX_EXP_ARG else math.inf
        if not all(math.isfinite(v) for v in (*losses.values(), val_ppl)):
            raise TrainingDiverged(it, train_loss=losses["train"], val_loss=losses["val"])
        position.best_val_loss = min(position.best_val_loss, losses["val"])
        record = dict(iter=it, tokens=position.tokens_seen, train_loss=losses["train"],
                      val_loss=losses["val"], val_ppl=val_ppl, best_val_loss=position.best_val_loss,
                      **self.raw_model.metrics(), **optim.optimizer_metrics(self.optimizer),
                      **(self.pruner.metrics() if self.pruner is not None else {}),
                      peak_memory_mib=devices.peak_memory_mib(device),
                      # the pruning / MLA study's "training memory / model weights", per rank; None on CPUs (no reset)
                      memory_ratio=step_peak_mib * 2**20 / self.weights_bytes
                      if device.startswith("cuda") and step_peak_mib is not None else None)
        self.log.event("eval", messages.eval_line(record), **record)
        self.last = record
        if self.hellaswag and (it % self.cfg["hellaswag_interval"] == 0 or stop_reason):
            self.run_hellaswag(position)
        return record

    def run_hellaswag(self, position):
        # Eager (the compiled blocks too): every batch has a different length and would recompile.
        device, layout = self.layout.device, self.layout
        devices.reset_peak_memory(device)
        with torch.compiler.set_stance("force_eager"):
            result = evaluation.evaluate_hellaswag(self.raw_model, self.hellaswag, device, autocast=self.autocast,
                                                   replica=(layout.dp_rank, layout.dp, layout.dp_group), items=True)
        items = result.pop("items")  # per example: what a report pairs item by item across variants
        if layout.master:
            evaluation.write_items(os.path.join(self.cfg["out_dir"], rundir.HELLASWAG_ITEMS), items,
                                   append=True, iter=position.iter_num, tokens=position.tokens_seen)
        record = dict(iter=position.iter_num, tokens=position.tokens_seen,
                      peak_memory_mib=devices.peak_memory_mib(device), **result)
        self.log.event("hellaswag", messages.hellaswag_line(record), **record)

    def sample(self):
        """The end-of-run sample (sample_tokens), or None. Every rank generates (a TP forward all-reduces,
        a sharded one all-gathers: a master alone would wait for peers gone to the exit barrier), from one
        seed: the same tokens."""
        if not self.cfg["sample_tokens"]:
            return None
        torch.manual_seed(self.cfg["seed"])
        with torch.compiler.set_stance("force_eager"):  # one more token, one more length: no recompiles
            return evaluation.generate_text(self.raw_model, SAMPLE_PROMPT, self.cfg["sample_tokens"],
                                            self.layout.device, self.data.codec, self.autocast)


# ----------------------------------------------------------------------------- stopping

class StopSignals:
    """SIGTERM (what Slurm and Kubernetes send before killing a job), SIGINT (Ctrl-C) and SIGHUP (a
    closed terminal or a lost ssh session): once the loop runs, the first asks it to stop after the
    current step (under torchrun: after the next log step, where the ranks agree) and write a checkpoint; a second raises Interrupted at once, wherever the process
    is (inside a save, the previous checkpoint stays). Before the first step there is nothing to
    save, so a signal stops start-up at once. A SIGHUP ignored at launch (nohup) stays ignored."""

    def __init__(self, out_dir, distributed):
        self.out_dir = out_dir
        self.distributed = distributed  # ranks agree on stopping where they read their steps: at log steps
        self.received = None  # the first signal's name
        self.training = False  # set when the loop starts: from then on a first signal is a checkpoint
        self.previous = {}

    def __enter__(self):
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
                continue
            self.previous[signum] = signal.signal(signum, self.handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.received or not self.training:
            raise Interrupted(messages.stopped_at_once(name, self.received, rundir.checkpoint_path(self.out_dir)), signum)
        self.received = name
        # os.write, not print: a handler that prints while the interrupted code prints raises "reentrant call"
        os.write(2, messages.signal_received(name, self.distributed).encode())


# ----------------------------------------------------------------------------- the run

def main(argv):
    world_size = launched_world_size()  # torchrun's; the process group comes later
    # settled and checked before any work, then read-only: a key means one thing for the whole run
    cfg = types.MappingProxyType(runtime.resolve(configurator.apply_config(runtime.DEFAULTS, argv), world_size))
    layout = ParallelLayout.plan(cfg, world_size).start(cfg["device"], cfg["dist_timeout"])
    try:
        with rundir.out_dir_lock(cfg["out_dir"]) if layout.master else nullcontext(), \
                StopSignals(cfg["out_dir"], layout.distributed) as signals:
            stop_reason = train(cfg, layout, signals, command=["train.py", *argv])
    except RuntimeError as e:
        if layout.distributed:
            name_stalled_ranks(e, layout.rank, layout.world_size, cfg["dist_timeout"])
        raise
    code = EXIT_STOPPED_BY_SIGNAL if stop_reason == "signal" else 0
    if layout.distributed:
        exit_distributed(code)
    if code:
        sys.exit(code)


@dataclasses.dataclass
class RunData:
    dir: str
    counts: dict  # tokens per split
    codec: tuple = None  # (encode, decode) of the end-of-run sample, where sample_tokens asks for one


def check_before_building(cfg, layout, dtype):
    """The RunData: what can refuse the run, checked before a model exists."""
    if cfg["init_from"] in ("scratch", "resume"):
        sharding.check_memory(cfg, layout, runtime.count_params(cfg), dtype)
    if layout.device == "cpu":
        devices.keep_freed_memory()  # no mmap/page-fault/munmap of every activation in every step
    scan = layout.broadcast_object(tokendata.scan_data(cfg) if layout.rank == 0 else None)  # one scan a run
    data_dir, counts = tokendata.check_data(cfg, scan)
    codec = tokendata.text_codec(data_dir, cfg["vocab_size"]) if cfg["sample_tokens"] else None
    if codec:
        codec[0](SAMPLE_PROMPT)  # a prompt the model cannot read is refused now, not after training
    return RunData(data_dir, counts, codec)


@dataclasses.dataclass
class Training:
    """What a step trains with, built from one seed on every rank."""
    raw_model: torch.nn.Module
    model: torch.nn.Module  # raw_model compiled and wrapped (DDP, FSDP)
    optimizer: torch.optim.Optimizer
    pruner: optim.Pruner
    scaler: torch.amp.GradScaler
    trunk_tensors: forking.Loaded  # a branch's: the tensors taken from its trunk and its new ones
    report: dict  # the checklist's lines about the model: the head chosen, attn_impl='auto's choices

    def resume_state(self, eval_record):
        """What a checkpoint keeps beside the model, the optimizer and the position."""
        return dict(scaler=self.scaler.state_dict(), metrics=eval_record,
                    pruning=self.pruner.state_dict() if self.pruner is not None else None)


def build_for_training(cfg, layout, dtype, autocast, checkpoint, trunk):
    """The Training. The initial weights come from one seed on every rank; a branch then takes its
    trunk's tensors."""
    torch.manual_seed(tokendata.seed_of(cfg, "init"))
    raw_model = runtime.build_model(cfg, checkpoint, layout.tp_group).to(layout.device)
    loaded = forking.load_weights(trunk, raw_model) if trunk else None
    if trunk and cfg["fork_start"] == "preserve":  # new parameters start where the trunk's function is kept
        forking.preserve_start(raw_model)
    # head_loss='auto' settled by the memory estimate on rank 0, for every rank (a rank choosing alone could
    # disagree and run another head); config.json keeps what was asked, the checklist what runs
    head = layout.broadcast_object(sharding.choose_head_loss(cfg, layout, runtime.count_params(cfg), dtype)
                                   if layout.rank == 0 else None)
    raw_model.config.head_loss = head.head_loss
    # reduced_sync: count one tiny step's all-reduces against the schedule (before DDP's or FSDP's
    # hooks exist; it forks the RNG and clears its gradients)
    report = dict(head_loss=messages.head_choice(head),
                  **(raw_model.startup_report(layout.device) if hasattr(raw_model, "startup_report") else {}))
    if cfg["attn_impl"] == "auto":  # measured before compiling, each path as it will run; the blocks read these
        choices = layout.broadcast_object(raw_model.measure_attn_auto(cfg["batch_size"], layout.device, autocast,
                                                                      cfg["compile"]) if layout.rank == 0 else None)
        raw_model.use_attn_auto(choices)  # every rank runs rank 0's choices
        report["attn_auto"] = list(choices.values())
    model = layout.wrap(raw_model, dtype, cfg)
    optimizer = optim.build_optimizer(raw_model, cfg)
    pruner = optim.Pruner(raw_model, optimizer, cfg, runtime.last_iter(cfg)) if cfg["pruning"] != "none" else None
    scaler = torch.amp.GradScaler(layout.device.split(":")[0], enabled=dtype == "float16")
    return Training(raw_model, model, optimizer, pruner, scaler, loaded, report)


def start_position(cfg, layout, checkpointer, checkpoint, trunk, run):
    """(Position, Fork or None): where training goes on, from a resumed checkpoint, a trunk's
    continuation, or the start."""
    torch.manual_seed(cfg["seed"] + layout.dp_rank)  # dropout masks differ across replicas
    if checkpoint is not None:
        return checkpointer.restore(checkpoint, run.raw_model, run.optimizer, run.pruner, run.scaler), None
    if trunk:  # the trunk's continuation, with this run's model
        fork = checkpointer.continue_trunk(trunk, run.raw_model, run.optimizer, run.trunk_tensors)
        return fork.position(), fork
    return Position(), None


def record_start(cfg, layout, command, facts, data_changes, resumed):
    """config.json and run_info.json (provenance, measured facts), written before the first step."""
    if not layout.master:
        return
    with rundir.write_errors_named(f"{cfg['out_dir']}/config.json and run_info.json", "nothing was trained"):
        with rundir.atomic_write(os.path.join(cfg["out_dir"], "config.json"), "w") as f:
            json.dump(dict(cfg), f, indent=2, allow_nan=False)
        start = runrecord.provenance(runtime.REPO_DIR, list(command), layout.device, layout.world_size)
        if data_changes:
            start["data_changed"] = data_changes  # allowed by allow_data_change; reports refuse to compare it
        runrecord.write_run_info(cfg["out_dir"], start, facts, resumed)


def log_start(log, cfg, layout, run, data, dtype, act_norms, fork):
    """The start-up checklist (console and log.jsonl), the fork, the batch, the pruning; returns the
    FLOP/s peak MFU is against: on a CPU the matmul peak measured here for this dtype, on a GPU its
    data sheet's."""
    device, raw_model = layout.device, run.raw_model
    memory = sharding.memory_per_rank(dict(cfg, head_loss=raw_model.config.head_loss), layout, runtime.count_params(cfg),
                                  dtype)
    peak = devices.matmul_peak_flops(device, dtype) if device == "cpu" else peak_flops(device)
    checklist = runrecord.startup_checklist(cfg, layout, raw_model, data.counts, data.dir, dtype)
    checklist.update(data_parallel_replicas=layout.dp, data_parallel=layout.describe(),
                     memory_per_gpu_estimate=sharding.describe_memory(memory),
                     **{f"memory_estimate_{k}": v for k, v in memory.items()}, **run.report,
                     act_rms_after_layers=", ".join(map(str, act_norms.layers)),
                     **devices.device_facts(cfg, device, dtype, peak))
    log.event("checklist", messages.checklist(checklist), **checklist)
    if fork is not None:
        log.event("fork", messages.fork(fork), **fork.event())
    log.say(messages.tokens_per_iter(cfg, layout.dp))
    if run.pruner is not None:
        log.event("pruning", run.pruner.describe(), pruned=list(run.pruner.params), excluded=run.pruner.excluded)
    return peak


class Batches:
    """The training batches in order (a function of the data seed and the step), each read one
    micro-step ahead, while the device computes the current one."""

    def __init__(self, cfg, layout, data, iter_num):
        self.cfg, self.layout, self.data = cfg, layout, data
        self.accum = cfg["gradient_accumulation_steps"] // layout.dp  # micro-steps per rank
        self.current = self.fetch(iter_num, 0)

    def fetch(self, it, micro):
        offsets = train_offsets(self.cfg, self.data.counts["train"], it, micro * self.layout.dp + self.layout.dp_rank)
        return get_batch(self.data.dir, "train", offsets, self.cfg["block_size"], self.layout.device)

    def advance(self, it, micro):
        """After step it's micro-batch: the next one (after the last, the next step's first)."""
        self.current = self.fetch(*divmod(it * self.accum + micro + 1, self.accum))


def train_step(cfg, layout, run, batches, iter_num, lr, autocast):
    """One optimizer step of grad_accum micro-steps; returns its mean loss and gradient norm, on the device."""
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=layout.device)
    for micro in range(batches.accum):
        x, y = batches.current
        with layout.gradient_sync(run.model, last=micro == batches.accum - 1):
            with autocast:
                loss = run.model(x, y)[1]  # not kept: the full head's logits would live through backward
            batches.advance(iter_num, micro)  # the next micro-batch, read while the device computes
            loss_sum += loss.detach().float()
            run.scaler.scale(loss / batches.accum).backward()
    if run.pruner is not None:
        run.pruner.mask_grads()  # before clipping: pruned weights add nothing to the norm
    run.scaler.unscale_(run.optimizer)
    layout.agree_on_skipping(run.scaler, run.optimizer)
    grad_norm = layout.clip_grad_norm(run.raw_model, cfg["grad_clip"] or float("inf"))
    run.scaler.step(run.optimizer, **optim.step_kwargs(run.optimizer, grad_norm))
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    if run.pruner is not None:
        run.pruner.step(iter_num + 1)  # re-apply the masks; recompute them on the schedule
    return loss_sum / batches.accum, grad_norm


def train(cfg, layout, signals, command):
    """Train with a resolved cfg on this layout, out_dir locked; returns the stop reason."""
    devices.use_deterministic_algorithms(cfg["deterministic"])
    dtype, autocast = devices.precision(cfg["dtype"], layout.device)
    data = check_before_building(cfg, layout, dtype)
    checkpointer = Checkpointer(cfg, layout)
    checkpoint = runtime.load_checkpoint(cfg, checkpointer) if cfg["init_from"] == "resume" else None
    resumed = checkpoint is not None
    trunk = forking.read_trunk(cfg) if cfg["fork_from"] and not resumed else None
    data_changes = runrecord.data_changes_since_start(cfg, data.dir, data.counts) if resumed else None
    hellaswag = (evaluation.load_examples_on_ranks(cfg["hellaswag_input"] or "val", cfg["hellaswag_limit"], layout)
                 if cfg["hellaswag_interval"] else None)
    run = build_for_training(cfg, layout, dtype, autocast, checkpoint, trunk)
    act_norms = evaluation.ActivationNorms(run.raw_model, cfg["log_act_norm_layers"])
    position, fork = start_position(cfg, layout, checkpointer, checkpoint, trunk, run)
    del checkpoint

    log = rundir.RunLog(dict(cfg), layout.master)
    facts = None if resumed else runrecord.run_facts(cfg, layout, run.raw_model, run.optimizer, data.dir, data.counts,
                                                     dtype)
    record_start(cfg, layout, command, facts, data_changes, resumed)
    peak = log_start(log, cfg, layout, run, data, dtype, act_norms, fork)
    evaluator = Evaluator(cfg, layout, run.model, run.raw_model, run.optimizer, run.pruner, data, autocast, log,
                          hellaswag)
    metrics = StepMetrics(cfg, layout, run.raw_model, act_norms, log, dtype, peak, run.scaler)
    batches = Batches(cfg, layout, data, position.iter_num)
    stop_reason = budget_reached(cfg, position)
    signals.training = True
    try:
        while True:
            if evaluator.due(position.iter_num, stop_reason):
                evaluator.run(position, stop_reason, metrics.take_step_peak())
            checkpointer.save(position, run.raw_model, run.optimizer, stop_reason, **run.resume_state(evaluator.last))
            if stop_reason:
                break
            metrics.start_step()
            lr = learning_rate_at(cfg, position.iter_num)
            loss, grad_norm = train_step(cfg, layout, run, batches, position.iter_num, lr, autocast)
            stop_reason = metrics.end_step(loss, grad_norm, lr, position, signals)
    except TrainingDiverged as e:
        log.event("diverged", messages.diverged(e.iter_num, e.fields, rundir.checkpoint_path(cfg["out_dir"])),
                  iter=e.iter_num, **e.fields)
        log.close()
        raise

    end = dict(stop_reason=stop_reason, signal=signals.received, iter=position.iter_num, tokens=position.tokens_seen,
               train_time=position.train_time, best_val_loss=position.best_val_loss,
               load_average=runrecord.load_average())
    log.event("end", messages.end(end, saved=checkpointer.will_save(position.iter_num, stop_reason)), **end)
    sample = evaluator.sample()
    if sample is not None:
        log.say(messages.sample(sample))
    log.close()
    return stop_reason


if __name__ == "__main__":
    configurator.run_script(main, FileNotFoundError, TrainingDiverged, Interrupted, rundir.RunDirError, RankStalled)
