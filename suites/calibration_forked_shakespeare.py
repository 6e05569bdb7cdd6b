# A forked true null with seed-to-seed variance, in a family of four as a forked report tests four
# variants: per seed the baseline trains to step 250 of 500 (the RA twin's recipe and measurement,
# suites/ra_shakespeare.py), then the baseline and four copies of it continue from that trunk, each copy
# on another batch order of the same data seed (data_order 1-4): equal to the baseline in distribution,
# not run for run. tools/calibration.py reads it: each null alone, and how often sub-suites of 8 seeds
# (the forked suite's size) call any of the four better or worse under Holm (at most alpha if right).
# At the ladder's w40 (n_embd 40, its learning rate from the N^-1/3 rule): what is calibrated is the
# design's statistics (a shared trunk, four correlated branches, Holm), which do not depend on the width,
# and 20 seeds x 6 runs take about 33 minutes on 2 cores there against about 55 at w96.
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/calibration_forked_shakespeare.py
# python tools/calibration.py out-suite-calibration_forked_shakespeare --pilot_seeds=8
measure = {"config": ["../config/train_ra_baseline.py", "../config/ra_shakespeare.py"], "eval_interval": 250,
           "final_eval_iters": 100}
variants = {"baseline": measure, **{f"order{k}": {**measure, "data_order": k} for k in range(1, 5)}}
baseline = "baseline"
overrides = dict(n_embd=40, mla_latent_dim=10, learning_rate=0.005378, min_lr=0.0005378)
fork_at = 250
seeds = list(range(1, 21))
metric = "val_loss"
min_effect = 0.01
allowed = ["data_order"]
