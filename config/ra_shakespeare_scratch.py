# Overlay: the RA twin trained from scratch (suites/ra_shakespeare.py), given after any RA recipe like
# config/ra_shakespeare.py: the same data, 4 layers and evaluation, a narrower model trained 4x as long.
# python data/shakespeare/prepare.py --tokenizer=char && python train.py config/train_ra_late.py config/ra_shakespeare_scratch.py
# Why: from scratch, a run leaves the ~2.5 plateau at a moment that differs from seed to seed and from
# arm to arm; while the curve is still steep at the end, the final loss mostly records that moment.
# At the tuned rate the seed-to-seed sd of the baseline was ~0.04 at 96 wide x 500 steps and 0.023 at
# 64 wide x 1,000; at 64 wide x 2,000 steps (final loss ~1.70, the curve flattening) it measured 0.011
# on 4 seeds, for twice the CPU time (docs/ablation.md, "The from-scratch flagship, measured").
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra_shakespeare.py")).read())
out_dir = "out-ra-shakespeare-scratch"
n_embd = 64
mla_latent_dim = 16  # n_embd / 4, as at 96 wide
max_iters = 2000
warmup_iters = 80
learning_rate = 0.012
min_lr = 0.0012
lr_tuning = "tuned by tools/tune_lr.py on 2026-11-28 at commit e955ee93e1: baseline from scratch on 3 rates 0.006..0.024 (x2), seeds 903, 904, best 0.012 (bracketed); every variant's best of 0.5x/1x/2x (seeds 903, 904) is 1x"
