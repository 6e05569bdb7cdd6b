# QK-norm (each head's q and k RMS-normalized before the scores) against the RA baseline recipe at
# GPT-2 124M, three paired seeds. CPU twin: suites/qk_norm_shakespeare.py. docs/new-idea.md walks
# through it as the example of adding an idea.
# python sweep.py suites/qk_norm.py
variants = {"baseline": {"config": "../config/train_ra_baseline.py"},
            "qk_norm": {"config": "../config/train_qk_norm.py"}}
baseline = "baseline"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["qk_norm"]
