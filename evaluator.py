"""What a training run evaluates, on its own cadence: the Evaluator.

Every eval_interval steps, at the eval_at points a report reads and where the run stops: the mean
loss of train and val windows (evaluate); HellaSwag every hellaswag_interval steps and at the end;
after training, a sample of text. A non-finite evaluation loss stops the run before a checkpoint
could replace the last good one (TrainingDiverged).
"""
import math
import os

import torch

import devices
import evaluation
import messages
import optim
import rundir
import sharding
import tokendata
from tokendata import get_batch
from trainmetrics import TrainingDiverged

SAMPLE_PROMPT = "\n"  # the end-of-run sample (sample_tokens) continues a new line


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
        if not all(math.isfinite(v) for v in losses.values()):  # never let a NaN model replace a good checkpoint
            raise TrainingDiverged(it, train_loss=losses["train"], val_loss=losses["val"])
        position.best_val_loss = min(position.best_val_loss, losses["val"])
        record = dict(iter=it, tokens=position.tokens_seen, train_loss=losses["train"],
                      val_loss=losses["val"], val_ppl=math.exp(losses["val"]), best_val_loss=position.best_val_loss,
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
