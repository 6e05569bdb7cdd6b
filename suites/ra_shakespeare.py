# Does reciprocal attention help? The RA study's ablation (docs/experiments.md) as a CPU twin, every run from
# scratch: baseline, RAEARLY, RALATE, RAALL and RALEARN trained the whole budget (config/ra_shakespeare_scratch.py:
# 4 layers, 32 wide, 1,000 steps, 2M characters) on paired seeds, compared on validation loss over 100 batches
# (205k characters) at the end.
# From scratch because RA has no function-preserving start: a fork would measure the jump at the fork
# (suites/ra_shakespeare_forked.py asks that question on purpose). The recipe's learning rate is tuned
# (tools/tune_lr.py on seeds 903-904, reports/tune_ra_shakespeare_scratch).
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/ra_shakespeare.py
import json
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra.py")).read())
# Evaluations every quarter (the differences over tokens plot) and the deciding one at the end, with more windows.
variants = {name: {"config": [body["config"], "../config/ra_shakespeare_scratch.py"], "eval_interval": 500,
                   "final_eval_iters": 100} for name, body in variants.items()}
# 15 seeds: 75 runs of ~70-90 s, two at a time, fit an hour on 2 cores. Seeds 23-37: no tuning run used them.
seeds = list(range(23, 38))
tuning = "../reports/tune_ra_shakespeare_scratch/tuning.json"
# Each arm at its own best rate, best against best: the tuning's check (0.5x, 1x and 2x of the baseline's best on
# the tuning seeds) moves a variant whose best is not 1x; its same-rate comparison is in the tuning report.
tuned = json.load(open(os.path.join(os.path.dirname(__file__), tuning)))
for name, check in tuned["variants"].items():
    rate = check["best_factor"] * tuned["best_lr"]
    variants[name].update(learning_rate=rate, min_lr=rate * tuned["min_lr_ratio"])
allowed = allowed + ["learning_rate", "min_lr"]
