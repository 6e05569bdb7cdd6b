# QK-norm: each head's queries and keys RMS-normalized before the scores (ra_model.QKNorm), with no
# learned gain. Same model class and recipe as the RA ablation (_ra_common.py), so train_ra_baseline.py
# is its baseline: the runs differ in qk_norm alone. The worked example of docs/new-idea.md.
# python data/finewebedu/prepare.py && python train.py config/train_qk_norm.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_common.py")).read())
out_dir = "out-qk-norm"
wandb_run_name = "qk-norm"
qk_norm = True
