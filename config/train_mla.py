# MLA: multi-head latent attention in every layer, latent 128, per-head Q into the latent and
# per-head V up-projection; no reciprocal term (the pruning / MLA study's gpt2-ra-mla-baseline with ra_alpha=0.0).
# python train.py config/train_mla.py   (recipe: _ra_common.py)
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_common.py")).read())
out_dir = "out-mla"
wandb_run_name = "mla"
mla = True
mla_latent_dim = 128
mla_per_head_q_latent = True
mla_per_head_v_up = True
ra_pattern = "none"
