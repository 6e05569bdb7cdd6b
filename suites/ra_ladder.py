# The RA study's ablation (docs/experiments.md) across four GPT-2 sizes on FineWeb-Edu, forked within each
# size as the CPU twin is (suites/ra_ladder_shakespeare.py; written down for a GPU cluster, never run
# here): baseline, RALATE and RAALL, three paired seeds, every run on 8 GPUs.
# One recipe at every size (config/_ra_common.py: 131,072 tokens per step, AdamW, cosine to lr/10),
# micro-batch 16 x 8 steps under FSDP so that 774M fits a 40 GB GPU (config/train_gpt2_774m.py:
# 25.9 GiB per GPU); only the ladder's keys change between sizes:
#   size  shape (layers, heads, width)  N (12 L d^2)  steps    tokens   learning rate
#   40M    8, 10,  640                   39.3M        13,000    1.70B    7.75e-4
#   124M  12, 12,  768                   84.9M        13,000    1.70B    6e-4 (the recipe's)
#   350M  24, 16, 1024                    302M        13,000    1.70B    3.93e-4
#   774M  36, 20, 1280                    708M        13,000    1.70B    2.96e-4
# 2.89 e-folds of N. Size is the only thing that changes: the same 13,000 optimizer steps of the same
# 1.70B tokens at every size (tokens fixed: "at this budget, does the effect change with N?"; 20
# tokens per parameter would make 774M train 8x longer than 124M, confounding size with training
# length). The learning rate follows N^-1/3 from 124M's 6e-4 (GPT-3's table gives 3e-4 and 2.5e-4
# at 350M and 774M) and is checked: lr_check trains the baseline at 0.5x, 1x and 2x at 40M and 774M.
# Forked at step 6,500 within each size (trunk per seed and size). No `sd` is declared: none has been
# measured at these sizes; a 124M pilot (python sweep.py suites/ra.py with fork_at) gives one, and
# --plan then prints the slope the ladder can detect. --plan prints the GPU-hours (6 N D at 40% MFU).
# 4 sizes x 3 seeds x (trunk + 3 branches) + 6 learning-rate checks = 54 runs.
# python data/finewebedu/prepare.py && python sweep.py suites/ra_ladder.py --launcher=slurm --slurm_gpus_per_node=8
# python sweep.py suites/ra_ladder.py --plan
import os

exec(open(os.path.join(os.path.dirname(__file__), "ra.py")).read())
variants = {name: variants[name] for name in ("baseline", "late", "all")}
nproc = 8
overrides = dict(max_iters=13000, batch_size=16, gradient_accumulation_steps=8, data_parallel="fsdp")
fork_at = 6500
fork_cold_starts = ["late", "all"]  # RA has no function-preserving start: the fork's question, asked on purpose
ladder = dict(
    sizes={"40M": dict(n_layer=8, n_embd=640, n_head=10),
           "124M": dict(n_layer=12, n_embd=768, n_head=12),
           "350M": dict(n_layer=24, n_embd=1024, n_head=16),
           "774M": dict(n_layer=36, n_embd=1280, n_head=20)},
    reference="124M",  # the recipe's own shape (config/train_gpt2.py)
    tokens=("params", 0.0),  # the same steps and tokens at every size
    learning_rate=("params", -1 / 3),
    alpha=0.05,
    lr_check=(0.5, 2.0),
    extrapolate_to=("gpt2-1558M", dict(n_layer=48, n_embd=1600, n_head=25)),
)
