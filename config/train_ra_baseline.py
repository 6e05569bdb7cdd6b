# RA ablation, baseline: standard attention in every layer (the RA study's B0), same model class and
# recipe as every run of the set (see _ra_common.py).
# python data/finewebedu/prepare.py && python train.py config/train_ra_baseline.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_common.py")).read())
out_dir = "out-ra-baseline"
wandb_run_name = "ra-baseline"
ra_pattern = "none"
