# The CPU-sized version of config/train_ra_early.py (shared settings: _ra_shakespeare.py).
# python data/shakespeare/prepare.py && python train.py config/train_ra_early_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_shakespeare.py")).read())
out_dir = "out-ra-early-shakespeare"
ra_pattern = "early"
ra_mode = "mix"
ra_alpha = 0.5
