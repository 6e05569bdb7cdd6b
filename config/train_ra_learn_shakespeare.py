# The CPU-sized version of config/train_ra_learn.py (shared settings: _ra_shakespeare.py).
# python data/shakespeare/prepare.py && python train.py config/train_ra_learn_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_shakespeare.py")).read())
out_dir = "out-ra-learn-shakespeare"
ra_pattern = "learned"
