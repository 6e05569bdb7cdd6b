# A/A check of the engine itself: model_type='gpt' against model_type='ra' with ra_pattern='none'
# (the same network) on the RA CPU twin (config/ra_shakespeare.py). The pair must come out
# "deterministic" (exactly equal runs) and swap_all must not be called better or worse beyond the
# rate alpha allows; anything else is a bug in the model, the pairing or the statistics.
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/aa.py
base = ["../config/train_ra_baseline.py", "../config/ra_shakespeare.py"]
# swap_all: S^T in every layer is a relabelling of W_q and W_k, so it equals the baseline in
# distribution but not run for run: a true null with seed-to-seed variance, which tests the
# statistics' false-positive rate (the bitwise-equal gpt pair tests only the plumbing).
variants = {"ra_none": {}, "gpt": {"model_type": "gpt"}, "swap_all": {"ra_pattern": "all", "ra_mode": "swap"}}
baseline = "ra_none"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["model_type", "ra_pattern", "ra_mode"]
