# SDPA against the hand-written attention (the Wikitext-2 template, docs/experiments.md): the same mathematics, so the
# expected verdict is "no detectable difference"; the cost columns show what SDPA saves.
# python sweep.py suites/attn_impl.py
# CPU twin: python data/shakespeare/prepare.py && python sweep.py suites/attn_impl.py config/small_shakespeare.py
base = ["../config/train_wikitext2.py"]
variants = {"sdpa": {"attn_impl": "sdpa"}, "manual": {"attn_impl": "manual"}}
baseline = "sdpa"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["attn_impl"]
