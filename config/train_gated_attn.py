# Gated attention (arXiv 2505.06708): a sigmoid gate, computed from the block input, on each head's
# output. Same model class and recipe as the RA ablation (_ra_common.py), so train_ra_baseline.py is
# its baseline: the runs differ in attn_gate alone (and the gate's own weights). The paper found the
# gain reproducible, which makes this the positive control of an ablation suite.
# python data/finewebedu/prepare.py && python train.py config/train_gated_attn.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_common.py")).read())
out_dir = "out-gated-attn"
wandb_run_name = "gated-attn"
attn_gate = True
