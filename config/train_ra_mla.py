# RA+MLA: the MLA of train_mla.py plus the reciprocal term K_i.Q_j in every layer, logits
# S + 0.5 * S^T with S^T kept within 64 positions (the pruning / MLA study's RA+MLA settings).
# python train.py config/train_ra_mla.py   (recipe: _ra_common.py)
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_common.py")).read())
out_dir = "out-ra-mla"
wandb_run_name = "ra-mla"
mla = True
mla_latent_dim = 128
mla_per_head_q_latent = True
mla_per_head_v_up = True
ra_pattern = "all"
ra_mode = "mix"
ra_alpha = 0.5
ra_window = 64
# The windowed mix keeps its doubled queries and keys, duplicated keys and padded values for
# backward (1.36x the baseline's peak memory at 124M, T=1024); recomputing the attention core
# brings it under MLA's (tools/bench_ra_variants.py). Same numbers, one more attention forward per layer.
attn_recompute = True
