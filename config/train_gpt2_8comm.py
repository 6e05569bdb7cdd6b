# 8 all-reduces per forward pass: [SPD, Parallel, Parallel] x 4 = 4 SPD syncs + 4 merges of the parallel
# runs. The communication study's [SPD, Parallel] x 6 costs 12, not 8: each lone parallel block between
# two SPD syncs must still be merged once (docs/experiments.md, "Counting syncs"), and [SPD, P, P] x 4
# costs 8.
# torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_8comm.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_reduced_sync_common.py")).read())

block_pattern = "spd,parallel,parallel"
out_dir = "out-gpt2-124M-8comm"
wandb_run_name = "gpt2-124M-8comm"
