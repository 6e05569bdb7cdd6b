# Does reciprocal attention help? The RA study's ablation (docs/experiments.md) as a CPU twin, every run from
# scratch: baseline, RAEARLY, RALATE, RAALL and RALEARN trained the whole budget (500 steps, 1M characters)
# on paired seeds, compared on validation loss over 100 batches (205k characters) at the end.
# From scratch because RA has no function-preserving start: a fork would measure the jump at the fork
# (suites/ra_shakespeare_forked.py asks that question on purpose). The recipe's learning rate is tuned
# (tools/tune_lr.py on seeds 901-902, reports/tune_ra_shakespeare), and each variant's own best rate was
# checked there at 0.5x / 1x / 2x.
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/ra_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra.py")).read())
# An evaluation half-way (the differences over tokens plot) and the deciding one at the end, with more windows.
variants = {name: {"config": [body["config"], "../config/ra_shakespeare.py"], "eval_interval": 250,
                   "final_eval_iters": 100} for name, body in variants.items()}
# 12 seeds: the from-scratch paired-difference sd of this twin (~0.012 before tuning) detects about 0.014 at
# Holm's alpha/4 with 80% power, and 60 runs of ~90 s fit an hour on 2 cores. Seeds 23-34: none used before.
seeds = list(range(23, 35))
tuning = "../reports/tune_ra_shakespeare/tuning.json"
