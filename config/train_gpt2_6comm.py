# 6 all-reduces per forward pass: [SPD, Parallel, Parallel, Parallel] x 3 = 3 SPD syncs +
# 3 merges. (The communication study's [SPD, P, P] x 4, counted honestly, is 8: see train_gpt2_8comm.py.)
# torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_6comm.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_reduced_sync_common.py")).read())

block_pattern = "spd,parallel,parallel,parallel"
out_dir = "out-gpt2-124M-6comm"
wandb_run_name = "gpt2-124M-6comm"
