# MLA and RA+MLA against the baseline (the pruning / MLA study, docs/experiments.md), three paired seeds,
# GPT-2 124M. CPU twin: suites/mla_shakespeare.py.
# python sweep.py suites/mla.py
variants = {"baseline": {"config": "../config/train_ra_baseline.py"},
            "mla": {"config": "../config/train_mla.py"},
            "ra_mla": {"config": "../config/train_ra_mla.py"}}
baseline = "baseline"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
# attn_recompute changes what backward keeps, not the numbers (tests/test_ra_model.py)
allowed = ["mla", "ra_pattern", "ra_mode", "ra_alpha", "ra_window", "attn_recompute"]
