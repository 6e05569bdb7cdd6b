# Pre- vs post-LayerNorm, with and without learning-rate warmup (the Wikitext-2 template, docs/experiments.md),
# three paired seeds. Post-LN without warmup is the classic unstable corner: a diverged run is
# reported as such, never dropped.
# python sweep.py suites/ln_warmup.py
# CPU twin: python data/shakespeare/prepare.py && python sweep.py suites/ln_warmup.py config/small_shakespeare.py
base = ["../config/train_wikitext2.py"]
variants = {"pre": {}, "post": {"ln_placement": "post"},
            "pre_nowarmup": {"warmup_iters": 0}, "post_nowarmup": {"ln_placement": "post", "warmup_iters": 0}}
baseline = "pre"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["ln_placement", "warmup_iters"]
