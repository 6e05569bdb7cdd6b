"""What train.py and the evaluation scripts share: HellaSwag scoring, perplexity on a fixed prefix
of val.bin, sampling text, and the residual stream's RMS that train.py logs. Entry points (hellaswag.py, eval.py, sample.py) and train.py import
this module; it imports only libraries and the data helpers.

HellaSwag (completion style). Each example becomes one row per ending, context tokens followed by the tokens of " " + ending.
An ending's loss is the model's cross-entropy on the ending tokens only; acc picks the ending with
the smallest summed loss, acc_norm the smallest mean loss per token (length-normalized), as in
build-nanogpt. (lm-evaluation-harness normalizes by bytes instead, so its acc_norm differs a
little.) Chance is 0.25; GPT-2 124M's score: docs/experiments.md.

Ties go to the lowest ending index. A tie is exact: a token's loss depends only on its logit and
the set of logits at its position (not their vocabulary order, nor the row's place in the batch),
and an ending's sum only on the set of its tokens' losses, so two endings that the model gives
the same probability token by token score exactly alike (see order_free_logsumexp).

Perplexity. The first eval_tokens + 1 tokens of val.bin are cut into contiguous, non-overlapping windows of
block_size inputs, each with its targets shifted by one, so every evaluated token is predicted
exactly once. A last window shorter than block_size is dropped (it would predict with a different
context length), so `tokens` is eval_tokens rounded down to a multiple of block_size. Unlike
a training run's evaluate (train.py: spread windows, a few batches), this reads a fixed prefix: the number to
compare checkpoints with the same block_size on. Under torchrun rank r evaluates the windows
i with i % world_size == r; the per-window sums are gathered and added in window order, so the
result does not depend on the number of ranks beyond the rounding of the forward passes.
"""
import hashlib
import json
import math
import os
import urllib.request
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn import functional as F

import tokendata
from tokendata import get_batch

HELLASWAG_DIR = os.path.join(tokendata.DATA_ROOT, "hellaswag")
URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_{}.jsonl"
SPLITS = ("train", "val", "test")
PAD_ID = 0  # any valid id: padding follows the scored tokens, and causal attention never looks ahead


# ----------------------------------------------------------------------------- HellaSwag

def download(split, data_dir=HELLASWAG_DIR):
    """Path of hellaswag_<split>.jsonl in data_dir, fetched from the upstream repository once."""
    path = os.path.join(data_dir, f"hellaswag_{split}.jsonl")
    if os.path.exists(path):
        return path
    url = URL.format(split)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            data = response.read()
    except OSError as e:  # URLError, HTTPError and timeouts are all OSErrors
        raise FileNotFoundError(f"could not download {url} ({e}): download it on a machine with network "
                                f"access and pass --input=/path/to/hellaswag_{split}.jsonl") from e
    os.makedirs(data_dir, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"  # per process: torchrun ranks may download at the same time
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)  # never leave a truncated file that looks cached
    return path


def load_examples(path_or_split, limit=None, data_dir=HELLASWAG_DIR):
    """Examples from a hellaswag jsonl file (or a split name, downloaded on first use), each
    dict(ctx, endings, label, ctx_ids, ending_ids) with GPT-2 token ids. An ending is encoded with
    its leading space, the way it continues the context in running text."""
    path = download(path_or_split, data_dir) if path_or_split in SPLITS else path_or_split
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: pass a hellaswag jsonl file or one of {SPLITS}")
    enc = tokendata.gpt2_encoding()
    examples = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if limit and len(examples) >= limit:
                break
            if not line.strip():
                continue
            row = parse_row(line, f"{path}:{line_no}")
            examples.append(dict(ctx=row["ctx"], endings=row["endings"], label=int(row["label"]),
                                 ctx_ids=enc.encode_ordinary(row["ctx"]),
                                 ending_ids=[enc.encode_ordinary(" " + e) for e in row["endings"]]))
    return examples


ENDINGS = 4


def load_examples_on_ranks(path_or_split, limit, layout):
    """load_examples on every rank of a ParallelLayout, the master first, so a split is downloaded
    once rather than by every rank at once (train.py loads them at start-up: a missing file fails
    before training)."""
    if layout.master:
        examples = load_examples(path_or_split, limit=limit or None)
    layout.barrier()
    return examples if layout.master else load_examples(path_or_split, limit=limit or None)


def parse_row(line, where):
    """One example's dict from a line of the jsonl, refused with its file:line when malformed."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not a JSON object ({e.msg}): the file is damaged, download it again") from None
    if "label" not in row:
        raise ValueError(f"{where} has no label (the test split's labels are not public): evaluate on the val split")
    endings = row.get("endings")
    if not (isinstance(endings, list) and len(endings) == ENDINGS and all(isinstance(e, str) and e for e in endings)):
        raise ValueError(f"{where}: 'endings' must be {ENDINGS} non-empty strings, got {endings!r:.80}")
    if not isinstance(row.get("ctx"), str) or str(row["label"]) not in [str(i) for i in range(ENDINGS)]:
        raise ValueError(f"{where}: needs a 'ctx' string and a label in 0..{ENDINGS - 1}, got label {row['label']!r}")
    return row


@torch.no_grad()
def ending_losses(model, examples, device, autocast=nullcontext()):
    """Summed and mean cross-entropy over each ending's tokens given its context: two float64 CPU
    tensors of shape (len(examples), endings per example), from one forward pass.

    A row longer than block_size loses tokens from the left (the start of the context); an ending
    token is scored only if the token before it is inside the window.
    """
    block_size, vocab_size = model.config.block_size, model.config.vocab_size
    rows, n_scored = [], []
    for ex in examples:
        for ending in ex["ending_ids"]:
            ids = (ex["ctx_ids"] + ending)[-block_size:]
            rows.append(ids)
            n_scored.append(min(len(ending), len(ids) - 1))
    if min(n_scored) < 1:
        raise ValueError("an ending has no token to score (empty ending, empty context or block_size 1)")
    T = max(len(ids) for ids in rows)
    tokens = torch.full((len(rows), T), PAD_ID, dtype=torch.long)
    mask = torch.zeros(len(rows), T - 1, dtype=torch.bool)  # over targets tokens[:, 1:]
    for r, (ids, n) in enumerate(zip(rows, n_scored)):
        tokens[r, :len(ids)] = torch.tensor(ids)
        mask[r, len(ids) - 1 - n:len(ids) - 1] = True
    if tokens.max() >= vocab_size:  # on a GPU this would surface as an opaque device-side assert
        raise ValueError(f"token id {tokens.max().item()} is outside the model's vocabulary of {vocab_size}")
    with autocast:
        logits, _ = model(tokens.to(device))
    if logits.shape[:2] != tokens.shape:
        # A model that returns logits for the last position alone would score endings against nothing.
        raise ValueError(f"model returned logits of shape {tuple(logits.shape)} for input {tuple(tokens.shape)}: "
                         f"HellaSwag needs logits at every position")
    row, position = mask.nonzero(as_tuple=True)  # the scored tokens only
    scored = logits[row.to(device), position.to(device)].float()  # (tokens, vocab)
    target = scored.gather(1, tokens[row, position + 1].to(device)[:, None])[:, 0]
    token_losses = (order_free_logsumexp(scored) - target.double()).cpu()
    # math.fsum rounds the exact sum once: the same losses in any order give the same sum.
    sums = torch.tensor([math.fsum(token_losses[row == r].tolist()) for r in range(len(rows))], dtype=torch.float64)
    means = sums / mask.sum(1)
    return sums.view(len(examples), -1), means.view(len(examples), -1)


def order_free_logsumexp(logits, chunk=64):
    """log(sum(exp(x))) of each row of a float32 (rows, vocab) tensor, in float64, as a function of
    the row's values alone. A float sum depends on the order of its terms: cross_entropy's float32
    sum over 50k logits moves a token's loss by up to ~6e-5 with the token's place in the
    vocabulary, enough to split endings of equal probability. Here each exp(x - max) is rounded to
    a fixed point of 2^-bits and the integers are added, exactly and in any order; the rounding
    costs at most vocab * 2^-(bits+1) of a sum that is >= 1 (below 1e-9 for GPT-2's vocabulary)."""
    bits = 62 - math.ceil(math.log2(logits.size(1)))  # vocab terms of at most 2^bits fit in an int64
    out = []
    for part in logits.split(chunk):
        top = part.max(1, keepdim=True).values.double()
        total = torch.exp(part.double() - top).mul(2.0 ** bits).round().long().sum(1)
        out.append(top[:, 0] + torch.log(total.double()) - bits * math.log(2.0))
    return torch.cat(out)


def example_digest(ex):
    """An example's identity (context, endings, label): variants are compared item by item only on
    the same items, whichever file or limit they were evaluated with."""
    text = json.dumps([ex["ctx"], ex["endings"], ex["label"]])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@torch.no_grad()
def evaluate_hellaswag(model, examples, device, batch_size=8, autocast=nullcontext(), limit=None, replica=None,
                       items=False):
    """dict(acc, acc_norm, n) over examples[:limit] (None or 0: all), as from load_examples.
    items=True adds `items`: per example, in order, its digest, label, the four endings' summed and
    mean losses and whether acc and acc_norm got it right (what a per-item comparison pairs).

    Under torchrun (an initialized process group) rank r scores the examples i with
    i % world_size == r and the counts are summed with all_reduce: every rank must call this with
    the same examples. A tensor-parallel model spans several ranks, which must score the same
    examples together: pass replica=(dp_rank, dp_size, dp_group) and the examples are shared out
    by replica, the counts summed across replicas only. The model's training mode is restored
    afterwards, so train.py can call it between steps; pass the model before torch.compile, since
    rows change length every batch.
    """
    examples = examples[:limit] if limit else examples
    if not examples:
        raise ValueError("no HellaSwag examples to evaluate")
    # DDP's forward may broadcast buffers, a collective that would hang when ranks run different
    # numbers of batches; evaluation needs the wrapped module only.
    model = getattr(model, "module", model)
    distributed = dist.is_available() and dist.is_initialized()
    if replica is None:
        replica = (dist.get_rank(), dist.get_world_size(), None) if distributed else (0, 1, None)
    index, n_replicas, group = replica
    was_training = model.training
    model.eval()
    # Row i: the summed then the mean losses of example i's endings. Each row is filled by one
    # replica and zero on the others, so a sum over replicas gathers them exactly.
    losses = torch.zeros(len(examples), 2 * ENDINGS, dtype=torch.float64)
    mine = list(range(index, len(examples), n_replicas))
    for start in range(0, len(mine), batch_size):
        rows = mine[start:start + batch_size]
        sums, means = ending_losses(model, [examples[i] for i in rows], device, autocast)
        losses[rows] = torch.cat([sums, means], 1)
    model.train(was_training)
    if distributed:
        losses = losses.to(device)  # NCCL reduces GPU tensors only
        dist.all_reduce(losses, group=group)
        losses = losses.cpu()
    labels = torch.tensor([ex["label"] for ex in examples])
    # argmin breaks ties to the lowest index, the exact-tie rule described at the top
    correct, correct_norm = (losses[:, part].argmin(1) == labels for part in (slice(0, ENDINGS), slice(ENDINGS, None)))
    n = len(examples)
    result = dict(acc=correct.sum().item() / n, acc_norm=correct_norm.sum().item() / n, n=n)
    if items:
        result["items"] = [dict(example=example_digest(ex), label=ex["label"], loss_sum=row[:ENDINGS],
                                loss_mean=row[ENDINGS:], correct=int(c), correct_norm=int(cn))
                           for ex, row, c, cn in zip(examples, losses.tolist(), correct, correct_norm)]
    return result


def write_items(path, items, append=False, **context):
    """Per-example HellaSwag records as JSON lines, each with `context` (e.g. iter and tokens)."""
    with open(path, "a" if append else "w") as f:
        f.write("".join(json.dumps(dict(context, **item)) + "\n" for item in items))


# ----------------------------------------------------------------------------- perplexity

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


# ----------------------------------------------------------------------------- text

def generate_text(model, prompt, max_new_tokens, device, codec, autocast=nullcontext(), temperature=0.8, top_k=200):
    """A sample continuing `prompt`; codec is tokendata.text_codec of the model's data."""
    encode, decode = codec
    idx = torch.tensor([encode(prompt)], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    with autocast:
        out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k)
    model.train(was_training)
    return decode(out[0].tolist())


class ActivationNorms:
    """Forward hooks that keep the RMS of the residual stream after chosen layers, from the latest
    micro-step while `active` (train.StepMetrics sets it for the steps a log line reads: each record is
    3 kernels per layer and micro-step, not worth running at every step). A reduced_sync model has the
    whole stream only at its sync points: a layer inside a parallel run is measured after the run's last
    layer (the start-up checklist lists them)."""

    def __init__(self, model, layers):
        self.latest = {}
        self.active = True
        n = len(model.transformer.h)
        self.layers = sorted({model.residual_layer(l % n) for l in layers})
        for layer in self.layers:
            model.residual_module(layer).register_forward_hook(self.hook(layer))

    def hook(self, layer):
        def record(module, inputs, output):
            if self.active:
                self.latest[layer] = output.detach().float().pow(2).mean().sqrt()
        return record

    def read(self):
        return {f"act_rms_layer{l}": v.item() for l, v in sorted(self.latest.items())}
