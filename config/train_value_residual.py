# Value residual learning (ResFormer, arXiv 2410.17897): each layer after the first attends to
# lam * v_n + (1 - lam) * v_1, v_1 being the first layer's values and lam learned per layer from 0.5
# (ra_model.ValueResidual). Same model class and recipe as the RA ablation (_ra_common.py), so
# train_ra_baseline.py is its baseline: the runs differ in value_residual alone (and its lambdas).
# A worked example of docs/new-idea.md.
# python data/finewebedu/prepare.py && python train.py config/train_value_residual.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_common.py")).read())
out_dir = "out-value-residual"
wandb_run_name = "value-residual"
value_residual = True
