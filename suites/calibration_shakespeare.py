# A true null with seed-to-seed variance, on the RA CPU twin, from scratch: swap_all (S^T in every
# layer, a relabelling of W_q and W_k: the baseline in distribution, not run for run) against the
# baseline, 20 paired seeds. docs/ablation.md reads it with tools/calibration.py: are the paired
# differences normal, does a 3-seed pilot predict their sd, how often do random 3-seed sub-suites
# call a difference better or worse (at most alpha, if the statistics are right)?
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/calibration_shakespeare.py
# The noise budget runs the same pair with one source of randomness fixed (docs/ablation.md):
#   python sweep.py suites/calibration_shakespeare.py --seeds=1,2,3,4 --data_seed=1 --sweep_dir=out-noise-data-fixed
#   python sweep.py suites/calibration_shakespeare.py --seeds=1,2,3,4 --init_seed=1 --sweep_dir=out-noise-init-fixed
# One evaluation, at the end, on 100 batches: the report reads nothing else.
base = ["../config/train_ra_baseline.py", "../config/ra_shakespeare.py"]
measure = {"config": base, "eval_interval": 500, "final_eval_iters": 100}
variants = {"baseline": measure, "swap_all": {**measure, "ra_pattern": "all", "ra_mode": "swap"}}
baseline = "baseline"
seeds = list(range(1, 21))
metric = "val_loss"
min_effect = 0.01
allowed = ["ra_pattern", "ra_mode"]
