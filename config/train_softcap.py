# Logit soft-capping (Gemma 2, arXiv 2408.00118): every attention logit s -> c * tanh(s / c) before the
# softmax (ra_model.SoftCap), c = 50 as in Gemma 2. A scores step runs on the manual path only (the fused
# kernels take no function of the scores), so this config sets attn_impl='manual'; its suite runs the
# baseline (config/train_ra_baseline.py) on the manual path too, so the runs differ in attn_softcap alone.
# A worked example of docs/new-idea.md.
# python data/finewebedu/prepare.py && python train.py config/train_softcap.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_ra_common.py")).read())
out_dir = "out-softcap"
wandb_run_name = "softcap"
attn_impl = "manual"
attn_softcap = 50.0
