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
lr_tuning = 'tuned by tools/tune_lr.py on 2026-12-06 at commit cf733ecef5 (its 12 runs at commits 2e429bb3a2 (baseline 2), 2e429bb3a2+dirty-d76b977c5ac6ea67 (baseline 2), cf733ecef5 (baseline 8)): baseline from scratch on 4 rates 0.00849..0.017 (x1.4142), seeds 903, 904, 905 (3 per rate), best 0.012 (bracketed); the optimum of a quadratic in log rate (95% Fieller interval; variants on seeds 903, 904, 905) against the shared rate 0.012: baseline 0.0124 [0.0115, 0.0137] covers it'
