# Positive control of the engine: a learning rate 10x too low on the RA CPU twin must be called
# "worse". A suite that cannot see this cannot see anything smaller.
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/positive_control.py
base = ["../config/train_ra_baseline.py", "../config/ra_shakespeare.py"]
variants = {"baseline": {}, "lr_10x_low": {"learning_rate": 3e-4, "min_lr": 3e-5}}
baseline = "baseline"
seeds = [1, 2, 3]
metric = "val_loss"
min_effect = 0.01  # nats per token: the smallest val-loss difference worth acting on (declared before the runs)
allowed = ["learning_rate", "min_lr"]
