# The CPU-sized version of config/train_gated_attn.py (shared settings: _ra_shakespeare.py); its
# baseline is train_ra_baseline_shakespeare.py.
# python data/shakespeare/prepare.py && python train.py config/train_gated_attn_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_shakespeare.py")).read())
out_dir = "out-gated-attn-shakespeare"
attn_gate = True
