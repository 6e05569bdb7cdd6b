# The RA ablation across a ladder of three widths of the Shakespeare twin (suites/ra_shakespeare_scratch.py):
# baseline, RALATE and RAALL, three paired seeds, at n_embd 48, 64 and 96 (4 layers, 4 heads).
# Tokens grow with non-embedding parameters N (a fixed number of tokens per parameter), the learning
# rate as N^-1/3, both from the twin's recipe at n_embd 96 (config/ra_shakespeare.py, shortened to
# 250 steps):
#   w48: N 110,592,  62 steps (127k tokens), lr 4.76e-3
#   w64: N 196,608, 111 steps (227k tokens), lr 3.93e-3
#   w96: N 442,368, 250 steps (512k tokens), lr 3e-3
# 27 runs, about 8 minutes on 2 free cores (from one timed run per width). A width-128 top size would
# take 2.5 times as long; on this shared machine (load 6-8 on 2 cores) that would not fit in 45 minutes.
# python data/shakespeare/prepare.py --tokenizer=char && python sweep.py suites/ra_ladder_shakespeare.py --cpu_runs=2
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra_shakespeare_scratch.py")).read())
variants = {name: variants[name] for name in ("baseline", "late", "all")}
overrides = dict(max_iters=250, warmup_iters=20)
ladder = dict(
    sizes={"w48": dict(n_layer=4, n_embd=48, n_head=4, mla_latent_dim=12),
           "w64": dict(n_layer=4, n_embd=64, n_head=4, mla_latent_dim=16),
           "w96": dict(n_layer=4, n_embd=96, n_head=4, mla_latent_dim=24)},
    reference="w96",  # the recipe's own shape: the rules scale from it
    tokens=("params", 1.0),  # max_iters (and warmup) proportional to N
    learning_rate=("params", -1 / 3),  # learning_rate and min_lr as N^-1/3
    alpha=0.05,  # the across-size statements: Bonferroni over the variants
    extrapolate_to=("gpt2-124M", dict(n_layer=12, n_embd=768, n_head=12)),
)
