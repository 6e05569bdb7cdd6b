# RA ablation, RALEARN: every layer computes (1-p) * attn(S) + p * attn(S^T), p = sigmoid of a
# learned per-layer logit (starting at p = 0.5); the gates p are logged as ra_gate_layer<i> at
# every evaluation. Two SDPA calls per layer, so no T x T score matrix is materialized.
# python train.py config/train_ra_learn.py   (recipe: _ra_common.py)
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_common.py")).read())
out_dir = "out-ra-learn"
wandb_run_name = "ra-learn"
ra_pattern = "learned"
ra_gate_init = 0.0
