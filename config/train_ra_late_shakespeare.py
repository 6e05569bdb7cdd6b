# The CPU-sized version of config/train_ra_late.py (shared settings: _ra_shakespeare.py).
# python data/shakespeare/prepare.py && python train.py config/train_ra_late_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_shakespeare.py")).read())
out_dir = "out-ra-late-shakespeare"
ra_pattern = "late"
ra_mode = "mix"
ra_alpha = 0.5
