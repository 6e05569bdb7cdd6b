# Gated attention (arXiv 2505.06708) as a forked CPU twin, the pattern of suites/ra_shakespeare.py: per
# seed the baseline trains to step 250 of 500, then baseline and gated continue from it; 8 seeds, 100
# final validation windows. The gate's weights are new at the fork: with their seeded initialization
# (sigmoid near 0.5) the branch starts from a shock (its loss right after the fork 2.434 against the
# baseline's 2.385 when this was first tried) that the remaining steps only recover from, and the fork
# reported "equivalent" to a baseline the gate beat in 3 of 3 seeds from scratch. So:
# - fork_start='preserve' (forking.preserve_start): the gate starts at exactly 0.5 with the trunk's
#   c_proj doubled, so the forked model computes the trunk's function; the report's loss jump at the
#   fork shows it (about 0);
# - bridge_seeds: both variants also from scratch on three seeds; the report puts the forked effect
#   beside the from-scratch one and says in its headline when the forked verdict does not stand.
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/gated_attn_shakespeare_forked.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "gated_attn.py")).read())
variants = {name: {"config": [body["config"], "../config/ra_shakespeare.py"], "eval_interval": 250,
                   "final_eval_iters": 100} for name, body in variants.items()}
fork_at = 250
seeds = list(range(1, 9))
bridge_seeds = [1, 2, 3]
overrides = dict(fork_start="preserve")  # the baseline has no new parameters: a no-op there
