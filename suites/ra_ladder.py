# The RA study's ablation (docs/experiments.md) across GPT-2 124M, 350M and 774M on FineWeb-Edu
# (written down for a GPU cluster, never run here): baseline, RALATE and RAALL, three paired seeds,
# every run on 8 GPUs.
# One recipe at every size (config/_ra_common.py: 131,072 tokens per step, AdamW, cosine to lr/10),
# micro-batch 16 x 8 steps under FSDP so that 774M fits a 40 GB GPU (config/train_gpt2_774m.py:
# 25.9 GiB per GPU); only the ladder's keys change between sizes:
#   size  shape (layers, heads, width)  N (12 L d^2)  steps    tokens   learning rate
#   124M  12, 12,  768                   84.9M        13,000    1.70B    6e-4 (the recipe's)
#   350M  24, 16, 1024                    302M        46,222    6.06B    3.93e-4
#   774M  36, 20, 1280                    708M       108,333   14.2B     2.96e-4
# Tokens are 20 per non-embedding parameter at every size (Chinchilla's ratio), the learning rate
# N^-1/3 from 124M's 6e-4 (GPT-3's table gives 3e-4 and 2.5e-4 for these sizes); warmup scales with
# the steps. 27 runs; the 774M ones dominate (6 N D = 6e19 FLOPs each).
# python data/finewebedu/prepare.py && python sweep.py suites/ra_ladder.py --launcher=slurm --slurm_gpus_per_node=8
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra.py")).read())
variants = {name: variants[name] for name in ("baseline", "late", "all")}
nproc = 8
overrides = dict(max_iters=13000, batch_size=16, gradient_accumulation_steps=8, data_parallel="fsdp")
ladder = dict(
    sizes={"124M": dict(n_layer=12, n_embd=768, n_head=12),
           "350M": dict(n_layer=24, n_embd=1024, n_head=16),
           "774M": dict(n_layer=36, n_embd=1280, n_head=20)},
    reference="124M",  # the recipe's own shape (config/train_gpt2.py)
    tokens=("params", 1.0),
    learning_rate=("params", -1 / 3),
    alpha=0.05,
    extrapolate_to=("gpt2-1558M", dict(n_layer=48, n_embd=1600, n_head=25)),
)
