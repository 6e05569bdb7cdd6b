# Overlay: the RA twin trained from scratch (suites/ra_shakespeare.py), given after any RA recipe like
# config/ra_shakespeare.py: the same data, 4 layers and evaluation, a narrower model trained twice as long.
# python data/shakespeare/prepare.py --tokenizer=char && python train.py config/train_ra_late.py config/ra_shakespeare_scratch.py
# Why 32 wide x 1,000 steps: from scratch, a run leaves the ~2.5 plateau at a moment that differs from
# seed to seed, and the final loss keeps that offset. The baseline's seed-to-seed sd was 0.023 at 64 wide
# x 1,000 steps, 0.011 at 64 x 2,000 and 0.012 at 32 x 1,000 for a third of the CPU time per run, so this
# size buys the most seeds per CPU-hour for the same noise (docs/ablation.md, "The from-scratch flagship,
# measured").
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra_shakespeare.py")).read())
out_dir = "out-ra-shakespeare-scratch"
n_embd = 32
mla_latent_dim = 8  # n_embd / 4, as at 96 wide
max_iters = 1000
warmup_iters = 40
learning_rate = 0.019
min_lr = 0.0019
lr_tuning = 'tuned by tools/tune_lr.py on 2026-11-28 at commit 477f673d8c: baseline from scratch on 3 rates 0.0095..0.038 (x2), seeds 903, 904, best 0.019 (bracketed); variants whose best rate differs (0.5x/1x/2x on seeds 903, 904): all 0.5x, learn 0.5x'
