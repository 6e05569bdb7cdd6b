# MLA and RA+MLA against the baseline (seeds/001), three paired seeds, CPU twin of suites/mla.py.
# python sweep.py suites/mla_shakespeare.py
variants = {"baseline": {"config": "../config/train_ra_baseline_shakespeare.py"},
            "mla": {"config": "../config/train_mla_shakespeare.py"},
            "ra_mla": {"config": "../config/train_ra_mla_shakespeare.py"}}
baseline = "baseline"
seeds = [1, 2, 3]
metric = "val_loss"
# attn_recompute changes what backward keeps, not the numbers (tests/test_ra_model.py)
allowed = ["mla", "ra_pattern", "ra_mode", "ra_alpha", "ra_window", "attn_recompute"]
