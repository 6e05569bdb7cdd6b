# Value residual learning (ResFormer) against the RA baseline recipe at GPT-2 124M, three paired seeds.
# CPU twin: suites/value_residual_shakespeare.py. docs/new-idea.md walks through it.
# python sweep.py suites/value_residual.py
variants = {"baseline": {"config": "../config/train_ra_baseline.py"},
            "value_residual": {"config": "../config/train_value_residual.py"}}
baseline = "baseline"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["value_residual"]
