"""The training run's words: every sentence train.py and its components print or log, written from the
numbers they return (log.jsonl keeps those numbers as fields; these lines are for people)."""
import math


def checklist(fields):
    return "\n".join(f"{k:>26}: {v}" for k, v in fields.items())


def head_choice(choice):
    """The checklist's head_loss line, from sharding.HeadChoice."""
    return f"{choice.head_loss} ({head_reason(choice)})"


def head_reason(choice):
    if choice.reason == "as set":
        return "as set"
    if choice.reason == "cpu":
        return "auto: on a CPU the chunked head is no slower than the full one, and needs less memory"
    return (f"auto: the estimate with the full head's logits x {choice.margin}, {gib(choice.needed)}, "
            f"{choice.reason} the {gib(choice.available)} free on {choice.device}")


def gib(n_bytes):
    return f"{n_bytes / 2**30:,.1f} GiB"


def tokens_per_iter(cfg, dp):
    return (f"tokens per iteration = batch_size {cfg['batch_size']} x block_size {cfg['block_size']} x "
            f"gradient_accumulation_steps {cfg['gradient_accumulation_steps']} "
            f"({cfg['gradient_accumulation_steps'] // dp} per rank x {dp} data-parallel ranks) = "
            f"{cfg['tokens_per_iter']:,}")


def fork(fork):
    return (f"forked from {fork.trunk} at iter {fork.iter}: {fork.loaded} tensors from the trunk, {fork.new} new, "
            f"optimizer state of {fork.optimizer_carried} parameters carried")


def eval_line(r):
    return (f"step {r['iter']}: train loss {r['train_loss']:.4f}, val loss {r['val_loss']:.4f}, "
            f"val ppl {r['val_ppl']:.2f}")


def hellaswag_line(r):
    return f"step {r['iter']}: hellaswag acc {r['acc']:.4f}, acc_norm {r['acc_norm']:.4f} ({r['n']} examples)"


def train_line(r):
    mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    return (f"iter {r['iter']}: loss {r['loss']:.4f}, lr {r['lr']:.3e}, grad norm {r['grad_norm']:.3f}, "
            f"{r['step_time_ms']:.1f} ms/iter, {r['tokens_per_sec']:,.0f} tok/s, mfu {mfu}, "
            f"peak mem {r['peak_memory_mib']:.0f} MiB")


def what_diverged(fields):
    """What went non-finite, from a TrainingDiverged's fields."""
    if "val_loss" in fields:
        train, val = fields["train_loss"], fields["val_loss"]
        if math.isfinite(train) and math.isfinite(val):  # finite, but beyond exp's range
            return f"evaluation loss became train {train}, val {val}, too large for a perplexity (exp overflows)"
        return f"evaluation loss became train {train}, val {val}"
    if math.isfinite(fields["loss"]):  # the loss held: the gradient norm tripped
        return f"grad norm became {fields['grad_norm']} (loss {fields['loss']})"
    return f"loss became {fields['loss']} (grad norm {fields['grad_norm']})"


def diverged(iter_num, fields, kept):
    """The diverged event's line; `kept`: the last checkpoint's path, or None."""
    truth = f"the last good checkpoint is untouched in {kept}" if kept else \
        "no checkpoint was written (none was due yet): lower the learning rate or check the data and start again"
    return f"iter {iter_num}: {what_diverged(fields)}: stopping; {truth}"


def end(record, saved):
    """The end event's line. `saved`: whether a stop by signal wrote its checkpoint."""
    by = record["stop_reason"]
    if by == "signal":
        by = (record["signal"] or "a signal to another rank") + (
            " (checkpoint written; resume with --init_from=resume)" if saved else "")
    return (f"stopped by {by} at iter {record['iter']}, {record['tokens']:,} tokens, "
            f"{record['train_time']:.1f} s of training; best val loss {record['best_val_loss']:.4f}")


def signal_received(name, distributed):
    until = " and those up to the next log step (every rank stops after the same one)" if distributed else ""
    return (f"{name} received: finishing this step{until}, then writing a checkpoint and stopping "
            f"(send it again to stop at once)\n")


def stopped_at_once(name, first, kept):
    """A second signal (`first` the first one's name) or one before the first step; `kept`: the last
    checkpoint's path or None."""
    truth = f"{kept} holds the last checkpoint written" if kept else "no checkpoint was written"
    when = f"second signal ({name} after {first})" if first else f"{name} before the first step"
    return f"{when}: stopped at once; {truth}"


def sample(text):
    return "sample:\n" + text
