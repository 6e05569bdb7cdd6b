# Overlay: the RA twin trained from scratch (suites/ra_shakespeare.py), given after any RA recipe like
# config/ra_shakespeare.py: the same data, 4 layers and evaluation, a narrower model trained 4x as long.
# python data/shakespeare/prepare.py --tokenizer=char && python train.py config/train_ra_late.py config/ra_shakespeare_scratch.py
# Why: from scratch, a run leaves the ~2.5 plateau at a moment that differs from seed to seed and from
# arm to arm; while the curve is still steep at the end, the final loss mostly records that moment.
# At 1.2e-2 the paired sds were 0.036-0.048 at 96 wide x 500 steps and 0.025-0.034 at 64 wide x 1,000;
# at 64 wide x 2,000 steps (final loss ~1.70, the curve flattening) they measured 0.008-0.011 on 3
# screening seeds, for twice the CPU time (docs/ablation.md, "The from-scratch flagship, measured").
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra_shakespeare.py")).read())
out_dir = "out-ra-shakespeare-scratch"
n_embd = 64
mla_latent_dim = 16  # n_embd / 4, as at 96 wide
max_iters = 2000
warmup_iters = 80
learning_rate = 0.012
min_lr = 0.0012
lr_tuning = 'tuned by tools/tune_lr.py on 2026-11-28 at commit a316454026: baseline from scratch on 6 rates 0.006..0.048 (x2, refined to x1.41 around the best), seeds 903, 904, 905, best 0.012 (the lowest rate within one standard error of the lowest mean, at 0.0339) (bracketed)'
