# A/A check of the engine itself: model_type='gpt' against model_type='ra' with ra_pattern='none'
# (the same network) on the RA CPU twin. The verdict must be "no detectable difference"; anything
# else is a bug in the model, the pairing or the statistics.
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/aa.py
base = ["../config/train_ra_baseline.py", "../config/ra_shakespeare.py"]
variants = {"ra_none": {}, "gpt": {"model_type": "gpt"}}
baseline = "ra_none"
seeds = [1, 2, 3]
metric = "val_loss"
allowed = ["model_type"]
