# The RA study's ablation (docs/experiments.md) at GPT-2 124M on FineWeb-Edu (config/_ra_common.py: one recipe,
# one model class, one optimizer and effective batch for every variant), three paired seeds.
# CPU twin: suites/ra_shakespeare.py. The RA study's 2-hour protocol: add --max_time=7200; the report
# then compares at the largest token count every run reached.
# python sweep.py suites/ra.py
variants = {name: {"config": f"../config/train_ra_{name}.py"}
            for name in ("baseline", "early", "late", "all", "learn")}
baseline = "baseline"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["ra_pattern", "ra_mode", "ra_alpha"]
