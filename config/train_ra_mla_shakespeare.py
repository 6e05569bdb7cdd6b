# The CPU-sized version of config/train_ra_mla.py (shared settings: _ra_shakespeare.py).
# python data/shakespeare/prepare.py && python train.py config/train_ra_mla_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_shakespeare.py")).read())
out_dir = "out-ra-mla-shakespeare"
mla = True
ra_pattern = "all"
ra_mode = "mix"
ra_alpha = 0.5
ra_window = 64
attn_recompute = True  # as in train_ra_mla.py
