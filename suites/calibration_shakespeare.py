# A true null with seed-to-seed variance, on the RA CPU twin, from scratch: swap_all (S^T in every
# layer, a relabelling of W_q and W_k: the baseline in distribution, not run for run) against the
# baseline, 20 paired seeds. docs/ablation.md reads it with calibration.py: are the paired
# differences normal, does a 3-seed pilot predict their sd, how often do random 3-seed sub-suites
# call a difference better or worse (at most alpha, if the statistics are right)?
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/calibration_shakespeare.py
# The noise budget runs the same pair with one source fixed (docs/ablation.md):
#   python sweep.py suites/calibration_shakespeare.py --data_seed=1 --sweep_dir=out-noise-data-fixed
base = ["../config/train_ra_baseline.py", "../config/ra_shakespeare.py"]
variants = {"baseline": {"config": base, "final_eval_iters": 100},
            "swap_all": {"config": base, "final_eval_iters": 100, "ra_pattern": "all", "ra_mode": "swap"}}
baseline = "baseline"
seeds = list(range(1, 21))
metric = "val_loss"
min_effect = 0.01
allowed = ["ra_pattern", "ra_mode"]
