# Overlay: the RA twin trained from scratch (suites/ra_shakespeare.py), given after any RA recipe like
# config/ra_shakespeare.py: the same data, 4 layers and evaluation, a narrower model trained twice as long.
# python data/shakespeare/prepare.py --tokenizer=char && python train.py config/train_ra_late.py config/ra_shakespeare_scratch.py
# Why not the forked twin's 96 wide x 500 steps: from scratch, its runs are still on the steep part of
# the loss curve at the end, after leaving the ~2.5 plateau tens of steps apart from seed to seed and
# from arm to arm, so the final loss mostly measures when a run left the plateau (paired sd ~0.04 at
# the tuned rate). 64 wide costs ~0.6x per step on a CPU, so 1,000 steps cost about what 500 did and
# end where the curve is flatter.
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra_shakespeare.py")).read())
out_dir = "out-ra-shakespeare-scratch"
n_embd = 64
mla_latent_dim = 16  # n_embd / 4, as at 96 wide
max_iters = 1000
warmup_iters = 80
learning_rate = 0.012
min_lr = 0.0012
lr_tuning = 'tuned by tools/tune_lr.py on 2026-11-28 at commit a316454026: baseline from scratch on 6 rates 0.006..0.048 (x2, refined to x1.41 around the best), seeds 903, 904, 905, best 0.012 (the lowest rate within one standard error of the lowest mean, at 0.0339) (bracketed)'
