# Does reciprocal attention help? The RA study's ablation (docs/experiments.md) as a CPU twin, every run from
# scratch: baseline, RAEARLY, RALATE, RAALL and RALEARN trained the whole budget (config/ra_shakespeare_scratch.py:
# 4 layers, 64 wide, 2,000 steps, 4M characters) on paired seeds, compared on validation loss over 100 batches
# (205k characters) at the end.
# From scratch because RA has no function-preserving start: a fork would measure the jump at the fork
# (suites/ra_shakespeare_forked.py asks that question on purpose). The recipe's learning rate is tuned
# (tools/tune_lr.py on seeds 903-904, reports/tune_ra_shakespeare_scratch).
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/ra_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra.py")).read())
# Evaluations every quarter (the differences over tokens plot) and the deciding one at the end, with more windows.
variants = {name: {"config": [body["config"], "../config/ra_shakespeare_scratch.py"], "eval_interval": 500,
                   "final_eval_iters": 100} for name, body in variants.items()}
# 5 seeds: 25 runs of ~4-5 min, two at a time, fit an hour on 2 cores. Seeds 23-27: no tuning run used them.
seeds = list(range(23, 28))
tuning = "../reports/tune_ra_shakespeare_scratch/tuning.json"
