# RA ablation, RAEARLY: reciprocal attention in layers 0-5 (first half), logits S + 0.5 * S^T
# (ra_mode='mix'; --ra_mode=swap runs S^T alone, which by itself only relabels W_q and W_k).
# python train.py config/train_ra_early.py   (recipe: _ra_common.py)
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_common.py")).read())
out_dir = "out-ra-early"
wandb_run_name = "ra-early"
ra_pattern = "early"
ra_mode = "mix"
ra_alpha = 0.5
