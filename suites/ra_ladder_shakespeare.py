# The RA ablation across a ladder of four widths of the Shakespeare twin, forked within each size
# (suites/ra_shakespeare_forked.py: per seed the baseline trains to step 250 of 500, then baseline, RALATE and
# RAALL continue from it), three paired seeds, at n_embd 24, 40, 64 and 96 (4 layers, 4 heads):
#   w24: N  27,648   w40: N  76,800   w64: N 196,608   w96: N 442,368   (2.77 e-folds of N)
# Size is the only thing that changes: the same 500 optimizer steps of the same 2,048 tokens at every
# size (tokens fixed: "at this training budget, does the effect change with N?", not "at each size's
# compute-optimal budget"; the latter needs tokens through the batch, which confounds the noise of a
# step). The learning rate follows N^-1/3 from the twin's 3e-3 at w96 and is checked, not assumed:
# lr_check runs the baseline from scratch at 0.5x, 1x and 2x the rule's rate at w24 and w96 (seed 1),
# reported beside the trend.
# Power (ablation/ladder_power.py, simulated exactly as the report fits): with the forked twin's
# paired-difference sd (0.0024 from a 14-seed pilot at w96; 0.003 declared, its upper bound), 3 seeds
# per size at Bonferroni 0.025 detect a slope of ~0.007 nats per e-fold of N with 80% power (the issue's
# target: 0.01); --plan prints it from `sd` before the runs, and the report from the measured ses.
# Runs: 4 sizes x 3 seeds x (trunk + 3 branches) = 48, plus 6 learning-rate checks; estimated at about
# 35 minutes on 2 free cores from the twin's timing (325 s per seed of 6 runs at w96; smaller sizes
# are cheaper, not proportionally). The extrapolation to GPT-2 124M lies ~2.6 ladder widths past w96:
# the report states it as an unsupported line without an interval.
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/ra_ladder_shakespeare.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra_shakespeare_forked.py")).read())
variants = {name: variants[name] for name in ("baseline", "late", "all")}
fork_cold_starts = ["late", "all"]
seeds = [1, 2, 3]
bridge_seeds = None  # the bridge is ra_shakespeare_forked.py's (w96); a ladder bridges no size
ladder = dict(
    sizes={"w24": dict(n_layer=4, n_embd=24, n_head=4, mla_latent_dim=6),
           "w40": dict(n_layer=4, n_embd=40, n_head=4, mla_latent_dim=10),
           "w64": dict(n_layer=4, n_embd=64, n_head=4, mla_latent_dim=16),
           "w96": dict(n_layer=4, n_embd=96, n_head=4, mla_latent_dim=24)},
    reference="w96",  # the recipe's own shape: the rules scale from it
    tokens=("params", 0.0),  # the same steps and tokens at every size
    learning_rate=("params", -1 / 3),  # learning_rate and min_lr as N^-1/3, checked by lr_check
    alpha=0.05,  # the across-size statements: Bonferroni over the variants
    sd=0.003,  # the paired-difference sd the plan assumes at every size (the forked pilot's, rounded up)
    lr_check=(0.5, 2.0),  # the baseline at these multiples of the rule's rate (and 1x) at w24 and w96
    extrapolate_to=("gpt2-124M", dict(n_layer=12, n_embd=768, n_head=12)),
)
