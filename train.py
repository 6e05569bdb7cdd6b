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
import signal
import sys
from contextlib import nullcontext

import torch

import configurator
import devices
import evaluation
import forking
import optim
import ra_model
import rundir
import runrecord
import runtime
import sharding
import tokendata
from model import GPTConfig, model_config_fields, peak_flops
from parallel import (ParallelLayout, RankStalled, checkpoint_path, exit_distributed, launched_world_size,
                      name_stalled_ranks)
from tokendata import get_batch, train_offsets


class TrainingDiverged(RuntimeError):
    pass


class Interrupted(Exception):
    """A second signal, or one before the first step: the run stops at once, with the shell's exit
    code for that signal."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.exit_code = 128 + signum


EXIT_STOPPED_BY_SIGNAL = 3  # a first signal: the step finished, a checkpoint was written, resume to go on
SAMPLE_PROMPT = "\n"  # the end-of-run sample (sample_tokens) continues a new line


# ----------------------------------------------------------------------------- schedule, metrics, stopping

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


def budget_reached(cfg, iter_num, tokens_seen, train_time):
    if iter_num >= cfg["max_iters"]:
        return "max_iters"
    if cfg["max_tokens"] and tokens_seen >= cfg["max_tokens"]:
        return "max_tokens"
    if cfg["max_time"] and train_time >= cfg["max_time"]:
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
            kept = checkpoint_path(self.out_dir)
            truth = f"{kept} holds the last checkpoint written" if kept else "no checkpoint was written"
            when = f"second signal ({name} after {self.received})" if self.received else f"{name} before the first step"
            raise Interrupted(f"{when}: stopped at once; {truth}", signum)
        self.received = name
        # os.write, not print: a handler that prints while the interrupted code prints raises "reentrant call"
        until = " and those up to the next log step (every rank stops after the same one)" if self.distributed else ""
        os.write(2, f"{name} received: finishing this step{until}, then writing a checkpoint and stopping "
                    f"(send it again to stop at once)\n".encode())


def diverged(log, cfg, iter_num, what, **fields):
    kept = checkpoint_path(cfg["out_dir"])
    truth = f"the last good checkpoint is untouched in {kept}" if kept else \
        "no checkpoint was written (none was due yet): lower the learning rate or check the data and start again"
    log.event("diverged", f"iter {iter_num}: {what}: stopping; {truth}", iter=iter_num, **fields)
    log.close()
    raise TrainingDiverged(f"{what} at iteration {iter_num}")


# ----------------------------------------------------------------------------- the run

def main(argv):
    world_size = launched_world_size()  # torchrun's; the process group comes later
    cfg = runtime.resolve(configurator.apply_config(runtime.DEFAULTS, argv), world_size)  # before any work
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


def check_before_building(cfg, layout, dtype):
    """(data_dir, token counts, sample codec): what can refuse the run, checked before a model exists."""
    if cfg["init_from"] in ("scratch", "resume"):
        layout.check_memory(cfg, runtime.count_params(cfg), dtype)
    if layout.device == "cpu":
        devices.keep_freed_memory()  # no mmap/page-fault/munmap of every activation in every step
    scan = layout.broadcast_object(tokendata.scan_data(cfg) if layout.rank == 0 else None)  # one scan a run
    data_dir, counts = tokendata.check_data(cfg, scan)
    codec = tokendata.text_codec(data_dir, cfg["vocab_size"]) if cfg["sample_tokens"] else None
    if codec:
        codec[0](SAMPLE_PROMPT)  # a prompt the model cannot read is refused now, not after training
    return data_dir, counts, codec


def build_for_training(cfg, layout, dtype, autocast, checkpoint, trunk):
    """(raw model, wrapped model, optimizer, pruner, scaler, fork record, model report). The initial
    weights come from one seed on every rank; a branch then takes its trunk's tensors."""
    torch.manual_seed(tokendata.seed_of(cfg, "init"))
    raw_model = runtime.build_model(cfg, checkpoint, layout.tp_group).to(layout.device)
    forked = forking.load_weights(trunk, raw_model) if trunk else None  # (tensors loaded, new ones)
    if trunk and cfg["fork_start"] == "preserve":  # new parameters start where the trunk's function is kept
        forking.preserve_start(raw_model)
    if cfg["init_from"] not in ("scratch", "resume"):
        cfg.update({k: getattr(raw_model.config, k) for k in model_config_fields(GPTConfig)})
    # head_loss='auto' settled by the memory estimate; config.json keeps what was asked, the checklist what runs
    raw_model.config.head_loss, why = layout.choose_head_loss(cfg, runtime.count_params(cfg), dtype)
    # reduced_sync: count one tiny step's all-reduces against the schedule (before DDP's or FSDP's
    # hooks exist; it forks the RNG and clears its gradients)
    model_report = dict(head_loss=f"{raw_model.config.head_loss} ({why})",
                        **(raw_model.startup_report(layout.device) if hasattr(raw_model, "startup_report") else {}))
    if cfg["attn_impl"] == "auto":  # measured eagerly before compiling: the compiled blocks read these choices
        choices = layout.broadcast_object(ra_model.measure_auto(raw_model, cfg["batch_size"], layout.device, autocast)
                                          if layout.rank == 0 else None)
        ra_model.AUTO_CHOICES.update(choices)  # every rank runs rank 0's choices
        model_report["attn_auto"] = list(choices.values())
    model = layout.wrap(raw_model, dtype, cfg)
    optimizer = optim.build_optimizer(raw_model, cfg)
    pruner = optim.Pruner(raw_model, optimizer, cfg, runtime.last_iter(cfg)) if cfg["pruning"] != "none" else None
    scaler = torch.amp.GradScaler(layout.device.split(":")[0], enabled=dtype == "float16")
    return raw_model, model, optimizer, pruner, scaler, forked, model_report


def restore_position(cfg, layout, checkpoint, trunk, raw_model, optimizer, pruner, scaler, forked):
    """(iter_num, tokens_seen, train_time, best_val, forked): where training goes on, from a resumed
    checkpoint, a trunk's continuation, or the start."""
    torch.manual_seed(cfg["seed"] + layout.dp_rank)  # dropout masks differ across replicas
    position = 0, 0, 0.0, float("inf")
    if checkpoint is not None:
        layout.restore(checkpoint, raw_model, optimizer)
        if pruner is not None and checkpoint.get("pruning"):  # a dense checkpoint starts with no masks
            pruner.load_state_dict(checkpoint["pruning"])
        scaler.load_state_dict(checkpoint["scaler"])
        position = (checkpoint["iter_num"], checkpoint["tokens_seen"], checkpoint["train_time"],
                    checkpoint["best_val_loss"])
    if trunk:  # the trunk's continuation, with this run's model
        return forking.continue_trunk(trunk, raw_model, optimizer, layout, cfg, forked)
    return (*position, forked)


def record_start(cfg, layout, command, facts, data_changes, resumed):
    """config.json and run_info.json (provenance, measured facts), written before the first step."""
    if not layout.master:
        return
    with rundir.write_errors_named(f"{cfg['out_dir']}/config.json and run_info.json", "nothing was trained"):
        with rundir.atomic_write(os.path.join(cfg["out_dir"], "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, allow_nan=False)
        start = runrecord.provenance(runtime.REPO_DIR, list(command), layout.device, layout.world_size)
        if data_changes:
            start["data_changed"] = data_changes  # allowed by allow_data_change; reports refuse to compare it
        runrecord.write_run_info(cfg["out_dir"], runtime.REPO_DIR, start, facts, resumed)


def log_checklist(log, cfg, layout, raw_model, counts, data_dir, dtype, extra):
    """The start-up checklist (console and log.jsonl); returns the FLOP/s peak MFU is against: on a
    CPU the matmul peak measured here for this dtype, on a GPU its data sheet's."""
    device = layout.device
    memory = layout.memory_estimate(dict(cfg, head_loss=raw_model.config.head_loss), runtime.count_params(cfg), dtype)
    peak = devices.matmul_peak_flops(device, dtype) if device == "cpu" else peak_flops(device)
    checklist = runrecord.startup_checklist(cfg, layout, raw_model, counts, data_dir, dtype)
    checklist.update(data_parallel_replicas=layout.dp, data_parallel=layout.describe(),
                     memory_per_gpu_estimate=sharding.describe_memory(memory),
                     **{f"memory_estimate_{k}": v for k, v in memory.items()}, **extra,
                     **devices.device_facts(cfg, device, dtype, peak))
    log.event("checklist", "\n".join(f"{k:>26}: {v}" for k, v in checklist.items()), **checklist)
    return peak


def train(cfg, layout, signals, command):
    """Train with a resolved cfg on this layout, out_dir locked; returns the stop reason."""
    device = layout.device
    devices.use_deterministic_algorithms(cfg["deterministic"])
    dtype, autocast = devices.precision(cfg["dtype"], device)
    data_dir, counts, codec = check_before_building(cfg, layout, dtype)
    checkpoint = runtime.load_checkpoint(cfg, layout) if cfg["init_from"] == "resume" else None
    resumed = checkpoint is not None
    trunk = forking.read_trunk(cfg) if cfg["fork_from"] and not resumed else None
    data_changes = runrecord.data_changes_since_start(cfg, data_dir, counts) if resumed else None
    hellaswag_examples = (evaluation.load_examples_on_ranks(cfg["hellaswag_input"] or "val", cfg["hellaswag_limit"],
                                                            layout) if cfg["hellaswag_interval"] else None)
    raw_model, model, optimizer, pruner, scaler, forked, model_report = build_for_training(
        cfg, layout, dtype, autocast, checkpoint, trunk)
    weights_bytes = sharding.local_weights_bytes(raw_model)  # this rank's: its FSDP or tensor-parallel shards
    act_norms = evaluation.ActivationNorms(raw_model, cfg["log_act_norm_layers"])
    iter_num, tokens_seen, train_time, best_val, forked = restore_position(
        cfg, layout, checkpoint, trunk, raw_model, optimizer, pruner, scaler, forked)
    del checkpoint

    log = rundir.RunLog(cfg, layout.master)
    facts = None if resumed else runrecord.run_facts(cfg, layout, raw_model, optimizer, data_dir, counts, dtype)
    record_start(cfg, layout, command, facts, data_changes, resumed)
    peak_flops = log_checklist(log, cfg, layout, raw_model, counts, data_dir, dtype, dict(
        model_report, act_rms_after_layers=", ".join(map(str, act_norms.layers))))
    if trunk:
        log.event("fork", **forked)
    grad_accum_local, tokens_per_iter, metrics = cfg["gradient_accumulation_steps"] // layout.dp, cfg["tokens_per_iter"], None
    log.say(f"tokens per iteration = batch_size {cfg['batch_size']} x block_size {cfg['block_size']} x "
            f"gradient_accumulation_steps {cfg['gradient_accumulation_steps']} "
            f"({grad_accum_local} per rank x {layout.dp} data-parallel ranks) = {tokens_per_iter:,}")
    if pruner is not None:
        log.event("pruning", pruner.describe(), pruned=list(pruner.params), excluded=pruner.excluded)

    start_iter = iter_num
    window = dict(time=0.0, iters=0, peak_mib=0.0)  # training steps since the last log line
    step_peak_since_eval = None  # MiB: the memory_ratio's numerator (a training step's, not evaluation's)
    timer = devices.DeviceTimer(device)
    unread = []  # the steps queued since the host last read the device: (loss, grad norm, timer lap)

    def fetch(it, micro):
        offsets = train_offsets(cfg, counts["train"], it, micro * layout.dp + layout.dp_rank)
        return get_batch(data_dir, "train", offsets, cfg["block_size"], device)

    batch = fetch(iter_num, 0)
    stop_reason = budget_reached(cfg, iter_num, tokens_seen, train_time)
    signals.training = True
    while True:
        checkpoint_due = iter_num % cfg["eval_interval"] == 0 or stop_reason
        read_here = iter_num in cfg["eval_at"]  # a point a report reads (an equal-FLOPs point): evaluate as at the end
        if (checkpoint_due or read_here) and stop_reason != "signal":  # a preempted job has seconds: save now, evaluate later
            devices.reset_peak_memory(device)  # evaluation's peak (a batch's whole logits) is logged apart
            losses = evaluate(model, cfg, layout, data_dir, counts, autocast,
                              final=stop_reason is not None or read_here)
            if not all(math.isfinite(v) for v in losses.values()):  # never let a NaN model replace a good checkpoint
                diverged(log, cfg, iter_num, f"evaluation loss became train {losses['train']}, val {losses['val']}",
                         train_loss=losses["train"], val_loss=losses["val"])
            best_val = min(best_val, losses["val"])
            metrics = dict(iter=iter_num, tokens=tokens_seen, train_loss=losses["train"],
                           val_loss=losses["val"], val_ppl=math.exp(losses["val"]), best_val_loss=best_val,
                           **raw_model.metrics(), **optim.optimizer_metrics(optimizer),
                           **(pruner.metrics() if pruner is not None else {}),
                           peak_memory_mib=devices.peak_memory_mib(device),
                           # the pruning / MLA study's "training memory / model weights", per rank; None on CPUs (no reset)
                           memory_ratio=step_peak_since_eval * 2**20 / weights_bytes
                           if device.startswith("cuda") and step_peak_since_eval is not None else None)
            log.event("eval", f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, "
                      f"val ppl {metrics['val_ppl']:.2f}", **metrics)
            step_peak_since_eval = None
            if hellaswag_examples and (iter_num % cfg["hellaswag_interval"] == 0 or stop_reason):
                # Eager (the compiled blocks too): every batch has a different length and would recompile.
                devices.reset_peak_memory(device)
                with torch.compiler.set_stance("force_eager"):
                    result = evaluation.evaluate_hellaswag(raw_model, hellaswag_examples, device, autocast=autocast,
                                                          replica=(layout.dp_rank, layout.dp, layout.dp_group),
                                                          items=True)
                items = result.pop("items")  # per example: what a report pairs item by item across variants
                if layout.master:
                    evaluation.write_items(os.path.join(cfg["out_dir"], rundir.HELLASWAG_ITEMS), items,
                                           append=True, iter=iter_num, tokens=tokens_seen)
                log.event("hellaswag", f"step {iter_num}: hellaswag acc {result['acc']:.4f}, acc_norm "
                          f"{result['acc_norm']:.4f} ({result['n']} examples)", iter=iter_num, tokens=tokens_seen,
                          peak_memory_mib=devices.peak_memory_mib(device), **result)
        if checkpoint_due and cfg["save_checkpoint"] and iter_num > start_iter:
            layout.save(cfg["out_dir"], iter_num, raw_model, optimizer, dict(
                scaler=scaler.state_dict(), config=cfg, iter_num=iter_num, tokens_seen=tokens_seen,
                param_names=None if layout.sharded or layout.tp > 1 else forking.param_names(raw_model, optimizer),
                train_time=train_time, best_val_loss=best_val, metrics=metrics,
                pruning=pruner.state_dict() if pruner is not None else None))
        if stop_reason:
            break

        devices.reset_peak_memory(device)
        timer.start()
        lr = learning_rate_at(cfg, iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=device)
        for micro in range(grad_accum_local):
            x, y = batch
            with layout.gradient_sync(model, last=micro == grad_accum_local - 1):
                with autocast:
                    _, loss = model(x, y)
                # the next micro-batch (after the last, the next step's first), read while the device computes
                batch = fetch(*divmod(iter_num * grad_accum_local + micro + 1, grad_accum_local))
                loss_sum += loss.detach().float()
                scaler.scale(loss / grad_accum_local).backward()
        if pruner is not None:
            pruner.mask_grads()  # before clipping: pruned weights add nothing to the norm
        scaler.unscale_(optimizer)
        layout.agree_on_skipping(scaler, optimizer)
        grad_norm = layout.clip_grad_norm(raw_model, cfg["grad_clip"] or float("inf"))
        scaler.step(optimizer, **optim.step_kwargs(optimizer, grad_norm))
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if pruner is not None:
            pruner.step(iter_num + 1)  # re-apply the masks; recompute them on the schedule

        unread.append((loss_sum / grad_accum_local, grad_norm, timer.stop()))  # still on the device
        step_peak = devices.peak_memory_mib(device)  # the allocator's books, kept on the host
        window["peak_mib"] = max(window["peak_mib"], step_peak)
        step_peak_since_eval = max(step_peak_since_eval or 0.0, step_peak)
        iter_num += 1
        tokens_seen += tokens_per_iter

        # The host reads the device only where the loop needs the numbers: a log line, an evaluation or a
        # checkpoint next, the end of the budget (max_time is checked here), a signal to a lone process.
        # In between it queues the next steps while the GPU still runs this one.
        log_due = iter_num % cfg["log_interval"] == 0
        if not (log_due or iter_num % cfg["eval_interval"] == 0 or iter_num in cfg["eval_at"]
                or budget_reached(cfg, iter_num, tokens_seen, train_time) or signals.received and not layout.distributed):
            continue
        steps, signalled = read_steps(unread, timer, layout, signals.received is not None)
        unread = []
        for it, (train_loss, grad_norm, dt) in enumerate(steps, start=iter_num - len(steps) + 1):
            train_time += dt
            window["time"] += dt
            window["iters"] += 1
            if not math.isfinite(train_loss) or (not math.isfinite(grad_norm) and not scaler.is_enabled()):
                diverged(log, cfg, it, f"loss became {train_loss} (grad norm {grad_norm})", loss=train_loss,
                         grad_norm=grad_norm)

        if log_due:
            step_time = window["time"] / window["iters"]
            tokens_per_sec = tokens_per_iter / step_time
            mfu, peak_flops = devices.model_flops_utilization(raw_model, tokens_per_sec / layout.world_size, device, dtype,
                                                      peak_flops)
            record = dict(iter=iter_num, tokens=tokens_seen, loss=train_loss, lr=lr, grad_norm=grad_norm,
                          **act_norms.read(), step_time_ms=1000 * step_time, tokens_per_sec=tokens_per_sec,
                          mfu=mfu, mfu_peak_gflops=peak_flops / 1e9 if peak_flops else None,
                          peak_memory_mib=window["peak_mib"], tokens_per_iter=tokens_per_iter,
                          load_average=runrecord.load_average())
            mfu_text = "n/a" if mfu is None else f"{100 * mfu:.1f}%"
            log.event("train", f"iter {iter_num}: loss {train_loss:.4f}, lr {lr:.3e}, grad norm {grad_norm:.3f}, "
                      f"{1000 * step_time:.1f} ms/iter, {tokens_per_sec:,.0f} tok/s, mfu {mfu_text}, "
                      f"peak mem {record['peak_memory_mib']:.0f} MiB", **record)
            window = dict(time=0.0, iters=0, peak_mib=0.0)
        stop_reason = budget_reached(cfg, iter_num, tokens_seen, train_time) or ("signal" if signalled else None)

    by = stop_reason
    if stop_reason == "signal":
        saved = cfg["save_checkpoint"] and iter_num > start_iter
        by = f"{signals.received or 'a signal to another rank'}" + (" (checkpoint written; resume with "
                                                                       "--init_from=resume)" if saved else "")
    log.event("end", f"stopped by {by} at iter {iter_num}, {tokens_seen:,} tokens, "
              f"{train_time:.1f} s of training; best val loss {best_val:.4f}", stop_reason=stop_reason,
              signal=signals.received, iter=iter_num, tokens=tokens_seen, train_time=train_time, best_val_loss=best_val,
              load_average=runrecord.load_average())
    if cfg["sample_tokens"]:
        # Every rank generates (a TP forward all-reduces, a sharded one all-gathers: a master alone would
        # wait for peers gone to the exit barrier), from one seed: the same tokens; the master prints them.
        torch.manual_seed(cfg["seed"])
        with torch.compiler.set_stance("force_eager"):  # one more token, one more length: no recompiles
            text = evaluation.generate_text(raw_model, SAMPLE_PROMPT, cfg["sample_tokens"], device, codec, autocast)
        log.say("sample:\n" + text)
    log.close()
    return stop_reason


if __name__ == "__main__":
    configurator.run_script(main, FileNotFoundError, TrainingDiverged, Interrupted, rundir.RunDirError, RankStalled)
