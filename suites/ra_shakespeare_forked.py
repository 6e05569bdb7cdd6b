# The fork's question for RA, asked on purpose (the answer to "does it help?" is suites/ra_shakespeare.py, from
# scratch): RA has no function-preserving start, so every RA branch starts from a jump in the loss at
# the fork (measured +0.06 to +0.09 for early, all and learn) and fork_cold_starts must name them.
# The RA study's ablation (docs/experiments.md) as a CPU twin, warmup-and-fork: per seed the baseline trains once to
# step 250 of 500 (its trunk), then baseline, RAEARLY, RALATE, RAALL and RALEARN each continue from it
# for the second half; compared on validation loss over 100 batches (205k characters) at the end.
# It answers "after 250 steps of the baseline, does switching to the variant for the rest of the
# budget beat continuing the baseline?", a narrower question than the from-scratch suite
# (ra_shakespeare.py), bought for resolution: the measured noise budget is in docs/ablation.md.
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/ra_shakespeare_forked.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra.py")).read())
# Evaluations only where the report reads them: the fork point and the end, with more windows.
variants = {name: {"config": [body["config"], "../config/ra_shakespeare.py"], "eval_interval": 250,
                   "final_eval_iters": 100} for name, body in variants.items()}
fork_at = 250
fork_cold_starts = ["early", "late", "all", "learn"]  # no function-preserving start exists for RA
# Planned from a 14-seed pilot (--plan --pilot, seeds 1-14): paired-difference sd 0.0024, 325 s of
# wall time per seed on 2 cores; 4 seeds would detect 0.01, 8 leave room for noisier variants within
# 30 minutes. Seeds 15-22: disjoint from the pilot's, whose runs would otherwise be the suite's own
# (bit for bit), a look at its data before the report.
seeds = list(range(15, 23))
# The bridge (ablation/bridge.py): every variant also from scratch on three of the seeds
# (scratch-<variant>-seed<s>), so that the report says whether each forked verdict's direction carries to
# training from scratch.
bridge_seeds = [15, 16, 17]
