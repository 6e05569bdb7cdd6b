# Gated attention (arXiv 2505.06708: a per-head sigmoid gate on the attention output, computed from
# the block's input) against the RA baseline recipe at GPT-2 124M. CPU twin: suites/gated_attn_shakespeare.py; three paired seeds.
# docs/experiments.md: when the RA question was asked again, with paired seeds, it improved quality reproducibly.
# python sweep.py suites/gated_attn.py
variants = {"baseline": {"config": "../config/train_ra_baseline.py"},
            "gated": {"config": "../config/train_gated_attn.py"}}
baseline = "baseline"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["attn_gate"]
