"""Perplexity of a checkpoint on the start of a dataset's validation split.

    python eval.py --out_dir=out-owt --dataset=openwebtext
    python eval.py --init_from=/path/to/gpt2 --dataset=openwebtext --eval_tokens=1000000 --out_json=gpt2.json
    torchrun --standalone --nproc_per_node=8 eval.py --out_dir=out-owt --dataset=openwebtext

The first eval_tokens + 1 tokens of val.bin are cut into contiguous, non-overlapping windows of
block_size inputs, each with its targets shifted by one, so every evaluated token is predicted
exactly once. A last window shorter than block_size is dropped (it would predict with a different
context length), so `tokens` is eval_tokens rounded down to a multiple of block_size. Unlike
train.py's evaluate (spread windows, a few batches), this reads a fixed prefix: the number to
compare checkpoints with the same block_size on. Under torchrun rank r evaluates the windows
i with i % world_size == r; the per-window sums are gathered and added in window order, so the
result does not depend on the number of ranks beyond the rounding of the forward passes.
"""
import json
import math
import os
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn import functional as F

import configurator
import rundir
import tokendata
from runtime import data_dir_of, exit_distributed, get_batch, load_model, precision, setup_distributed

DEFAULTS = dict(
    out_dir="out",
    init_from="resume",  # 'resume' reads out_dir/ckpt.pt; otherwise a local HF GPT-2 directory
    dataset="",  # reads data/<dataset>/val.bin
    data_dir="",  # or this directory's val.bin
    eval_tokens=0,  # tokens to predict from the start of val.bin; 0 means the whole split
    block_size=0,  # window length; 0 means the model's block_size
    batch_size=8,  # windows per forward pass
    device="",
    dtype="",  # 'bfloat16', 'float16', 'float32'; '' picks as train.py does
    out_json="",  # also write the result to this file
)


@torch.no_grad()
def evaluate_perplexity(model, data_dir, block_size, eval_tokens, device, batch_size=8, autocast=nullcontext()):
    """dict(loss, ppl, tokens, windows, block_size): mean cross-entropy per token (nats) over the
    windows described at the top of this file, and its exponential. Under an initialized process
    group every rank calls this and scores its share of the windows."""
    predictable = tokendata.split_num_tokens(data_dir, "val") - 1  # the first token has no prediction
    windows = min(eval_tokens or predictable, predictable) // block_size
    if windows < 1:
        raise ValueError(f"{data_dir}/val.bin: eval_tokens={eval_tokens} with {predictable + 1} tokens in the "
                         f"split leaves no full window of block_size={block_size}")
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    was_training = model.training
    model.eval()
    window_sums = torch.zeros(windows, dtype=torch.float64, device=device)  # summed loss per window
    mine = np.arange(rank, windows, world)
    for i in range(0, len(mine), batch_size):
        x, y = get_batch(data_dir, "val", mine[i:i + batch_size] * block_size, block_size, device)
        with autocast:
            logits, _ = model(x)
        # Our own cross-entropy rather than the model's loss, which a model may extend (aux losses).
        losses = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none")
        window_sums[mine[i:i + batch_size]] = losses.view(len(x), block_size).double().sum(1)
    model.train(was_training)
    if distributed:
        dist.all_reduce(window_sums)  # each window is nonzero on one rank only: the sum is exact
    total = math.fsum(window_sums.tolist())
    tokens = windows * block_size
    return dict(loss=total / tokens, ppl=math.exp(total / tokens), tokens=tokens, windows=windows,
                block_size=block_size)


def main(argv):
    cfg = configurator.apply_config(DEFAULTS, argv)
    if not (cfg["dataset"] or cfg["data_dir"]):
        raise configurator.ConfigError("no data: pass --dataset=NAME (reads data/NAME) or --data_dir=PATH")
    env = setup_distributed(cfg["device"])
    device = env["device"]
    dtype, autocast = precision(cfg["dtype"], device)
    data_dir = data_dir_of(cfg)
    if not os.path.exists(os.path.join(data_dir, "val.bin")):
        raise FileNotFoundError(f"{data_dir}/val.bin not found: prepare the dataset first "
                                f"(python data/{cfg['dataset'] or 'NAME'}/prepare.py) or fix --data_dir")
    model = load_model(cfg, device)
    top = tokendata.max_token_id(data_dir, ("val",))["val"]
    if top >= model.config.vocab_size:
        raise configurator.ConfigError(f"{data_dir}/val.bin holds token id {top}, outside the model's vocab_size "
                                       f"{model.config.vocab_size}: evaluate on a dataset with the model's tokenizer")
    block_size = cfg["block_size"] or model.config.block_size
    if block_size > model.config.block_size:
        raise configurator.ConfigError(f"block_size={block_size} exceeds the model's {model.config.block_size}")
    result = evaluate_perplexity(model, data_dir, block_size, cfg["eval_tokens"], device, cfg["batch_size"], autocast)
    source = cfg["out_dir"] if cfg["init_from"] == "resume" else cfg["init_from"]
    result = dict(model=source, data_dir=data_dir, dtype=dtype, **result)
    if env["master"]:
        print(f"{source} on {data_dir}/val.bin: loss {result['loss']:.4f}, perplexity {result['ppl']:.2f} "
              f"over {result['tokens']:,} tokens ({result['windows']} windows of {block_size})")
        if cfg["out_json"]:
            with open(cfg["out_json"], "w") as f:
                json.dump(result, f, indent=2)
    if env["ddp"]:
        exit_distributed()
    return result


if __name__ == "__main__":
    configurator.run_script(main, FileNotFoundError, ValueError, rundir.RunDirError)
