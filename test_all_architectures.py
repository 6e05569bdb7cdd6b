"""Smoke check of every architecture a user can pick: build a tiny model, run forward + backward on
random tokens, and require a finite loss and a finite gradient for every parameter.

    python test_all_architectures.py                 # all of them
    python test_all_architectures.py --only post     # names containing 'post'

A new architecture is one entry in ARCHITECTURES (and, for a new model family, one build function
in BUILDERS). Exit code 1 when any architecture fails. tests/test_model.py runs this script.
"""
import argparse
import itertools
import math
import os
import sys
import time

import torch

from model import GPT, GPTConfig

if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)  # tiny models: thread start-up costs more than it saves

# Shared by every entry; an entry's kwargs override these.
TINY = dict(block_size=32, vocab_size=128, n_layer=2, n_head=2, n_embd=32, dropout=0.0)


def build_gpt(**kwargs):
    return GPT(GPTConfig(**kwargs))


# model family -> function(**GPTConfig kwargs) -> model
BUILDERS = {"gpt2": build_gpt}

# name -> (family, kwargs on top of TINY)
ARCHITECTURES = {
    f"gpt2-{ln}-{attn}" + ("-ckpt" if ckpt else ""):
        ("gpt2", dict(ln_placement=ln, attn_impl=attn, activation_checkpointing=ckpt))
    for ln, attn, ckpt in itertools.product(("pre", "post"), ("sdpa", "manual"), (False, True))
}


def check(family, kwargs, batch_size=2, seed=0):
    """Forward + backward once; returns the parameter count or raises with the reason."""
    torch.manual_seed(seed)
    model = BUILDERS[family](**{**TINY, **kwargs}).train()
    cfg = model.config
    idx = torch.randint(0, cfg.vocab_size, (batch_size, cfg.block_size))
    targets = torch.randint(0, cfg.vocab_size, (batch_size, cfg.block_size))
    logits, loss = model(idx, targets)
    if logits.shape != (batch_size, cfg.block_size, cfg.vocab_size):
        raise AssertionError(f"logits shape {tuple(logits.shape)}")
    if not math.isfinite(loss.item()):
        raise AssertionError(f"loss is {loss.item()}")
    loss.backward()
    for name, p in model.named_parameters():
        if p.grad is None:
            raise AssertionError(f"{name} got no gradient")
        if not torch.isfinite(p.grad).all():
            raise AssertionError(f"{name} has a non-finite gradient")
    return sum(p.numel() for p in model.parameters())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="run only architectures whose name contains this")
    args = parser.parse_args(argv)
    names = [name for name in ARCHITECTURES if args.only in name]
    if not names:
        print(f"no architecture name contains {args.only!r}; known: {', '.join(ARCHITECTURES)}")
        return 1
    failed = []
    for name in names:
        family, kwargs = ARCHITECTURES[name]
        start = time.perf_counter()
        try:
            n_params = check(family, kwargs)
        except Exception as e:  # report every architecture, then fail at the end
            failed.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}")
        else:
            print(f"PASS {name} ({n_params:,} params, {1000 * (time.perf_counter() - start):.0f} ms)")
    print(f"{len(names) - len(failed)}/{len(names)} architectures passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
