# Does reciprocal attention help? The RA study's ablation (docs/experiments.md) as a CPU twin, every run from
# scratch: baseline, RAEARLY, RALATE, RAALL and RALEARN trained the whole budget (config/ra_shakespeare_scratch.py:
# 4 layers, 64 wide, 2,000 steps, 4M characters) on paired seeds, compared on validation loss over 100 batches
# (205k characters) at the end.
# From scratch because RA has no function-preserving start: a fork would measure the jump at the fork
# (suites/ra_shakespeare_forked.py asks that question on purpose). The recipe's learning rate is tuned
# (tools/tune_lr.py on seeds 903-905, reports/tune_ra_shakespeare_scratch).
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/ra_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra.py")).read())
# Evaluations every quarter (the differences over tokens plot) and the deciding one at the end, with more windows.
variants = {name: {"config": [body["config"], "../config/ra_shakespeare_scratch.py"], "eval_interval": 500,
                   "final_eval_iters": 100} for name, body in variants.items()}
# Declared before the runs: the blocked analysis (seed as block, many-to-one simultaneous intervals) with
# sequential seeds. Looks at 3 and 6 seeds; an arm decided at the first (its interval wholly beyond or inside
# +-min_effect) runs no more seeds. At most 30 runs of ~3-3.5 min, two at a time: under an hour on 2 cores.
# Seeds 31-36: no tuning run and no earlier report used them.
seeds = list(range(31, 37))
looks = [3, 6]
stop_decided = True
analysis = "blocked"
earlier = ["reports/ra_shakespeare at commit 3781cee: this recipe at 1.2e-2 (tuned on 2 seeds, x2 grid), seeds 23-27, "
           "the paired analysis with Holm: early worse by +0.027 [+0.002, +0.052], late, all and learn inconclusive"]
tuning = "../reports/tune_ra_shakespeare_scratch/tuning.json"
