# 6 all-reduces per forward pass: groups of 2 parallel blocks, one merge each.
# torchrun --standalone --nproc_per_node=8 train.py config/train_grouped_6sync.py
import os

exec(open(os.path.join(os.path.dirname(__file__), "_reduced_sync_common.py")).read())

block_pattern = "parallel"
sync_every = 2
out_dir = "out-gpt2-124M-grouped-6sync"
wandb_run_name = "gpt2-124M-grouped-6sync"
